// The HTTP/1.1 transport of `dllm serve` on Boost.Beast's parser and Boost.Asio's sockets: it accepts
// connections, reads each request's header and then its body within limits enforced while reading (header
// bytes and fields, body bytes whatever the framing, bodies in memory across connections, connections)
// and deadlines per phase (header, body, each write, the idle wait between requests), rejects what HTTP's
// framing makes ambiguous (Content-Length with Transfer-Encoding, repeated or malformed Content-Length),
// and hands each complete request to a handler on a worker thread. A handler answers whole or streams
// chunks; it can ask whether its client is still there (closed or reset). One asio thread does all the
// reading, so slow clients cost a socket and a timer each, never a thread.
#pragma once
#include <boost/beast/http/fields.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dllm::server {

struct HttpLimits {
  size_t max_header_bytes = 16 << 10;  // request line and fields together (beyond: 414 or 431)
  size_t max_header_fields = 100;      // beyond: 431
  size_t max_body_bytes = 4 << 20;     // Content-Length or chunked, counted while reading (beyond: 413)
  size_t max_body_memory = 64 << 20;   // bodies being read or handled at once, all connections (beyond: 503)
  int max_connections = 512;           // open at once (beyond: 503 and closed)
  std::chrono::milliseconds header_timeout{10000};  // from the first byte awaited to the header's end
  std::chrono::milliseconds body_timeout{30000};    // the whole body
  std::chrono::milliseconds write_timeout{30000};   // each write of an answer
  std::chrono::milliseconds idle_timeout{5000};     // keep-alive: the wait for the next request's first byte
  int workers = 64;                                 // handler threads
};

struct HttpRequest {
  std::string method, target, path, query;  // path: the target up to '?'
  boost::beast::http::fields headers;
  std::string body;
  std::string remote_addr;
  int remote_port = 0;
  unsigned version = 11;  // 10 or 11
  std::chrono::steady_clock::time_point start;  // when the request's first byte was awaited
  std::string header(const std::string& name) const;  // "" when absent
};

// An answer's header fields, in order.
using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

// One request's side of its connection, for its handler (one thread at a time).
class HttpExchange {
 public:
  virtual ~HttpExchange() = default;
  // A whole answer (Content-Length).
  virtual void respond(int status, const HttpHeaders& headers, const std::string& body) = 0;
  // A streamed answer: the header now (chunked on HTTP/1.1; HTTP/1.0 clients read to the connection's end),
  // then chunks; false once the client is gone or a write ran past its deadline.
  virtual bool start_stream(int status, const HttpHeaders& headers) = 0;
  virtual bool write_chunk(const std::string& data) = 0;
  virtual bool end_stream() = 0;
  // True when the client has closed its side or reset the connection.
  virtual bool client_gone() = 0;
};

class HttpServer {
 public:
  // Decides on a request from its header alone, before its body is read (the key, the route, the origin):
  // nonzero: answer that status with that body and close the connection (the body is never read).
  struct Early {
    int status = 0;
    HttpHeaders headers;
    std::string body;
  };
  using EarlyCheck = std::function<Early(const HttpRequest&)>;
  // Answers a complete request (on a worker thread). It must answer through the exchange exactly once
  // (respond, or start_stream ... end_stream); a handler that returns without answering leaves a 500.
  using Handler = std::function<void(const HttpRequest&, HttpExchange&)>;
  // The answer for a request the transport refuses itself (malformed, over a limit): status and message.
  using ErrorBody = std::function<std::string(int status, const std::string& message)>;
  // After each answer: the request, its status and its duration (for the log and the metrics).
  using Logger = std::function<void(const HttpRequest&, int status, double ms)>;

  HttpServer(HttpLimits limits, EarlyCheck early, Handler handler, ErrorBody error_body, Logger logger,
             HttpHeaders common_headers);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and listens (backlog: the system's maximum); port 0: any. Returns the port. Throws dllm::Error.
  int bind(const std::string& host, int port);
  // Starts the asio thread and the workers.
  void start();
  // No new connections; a request on an open one is answered 503, every answer from now closes its
  // connection.
  void stop_accepting();
  // Waits up to `wait` for the handlers to finish, then closes every connection and joins the threads.
  void stop(std::chrono::milliseconds wait);
  // Writes of answers give up at this time from now on (the shutdown's bound).
  void write_deadline(std::chrono::steady_clock::time_point t);

  struct Impl;  // http.cpp

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dllm::server
