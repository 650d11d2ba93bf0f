// The HTTP/1.1 transport (http.h). Reading happens on one asio thread: a connection's header, then its
// body, each under a deadline (a timer that closes the socket) and Beast's parser limits; a complete
// request goes to a worker thread, which writes its answer straight to the socket (poll with a deadline,
// so a client that stops reading costs at most write_timeout) and then hands the connection back to the
// asio thread for the next request or the close. While a worker holds a connection no asio operation is
// pending on it.
#include "server/http.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_set>

#include "common/error.h"
#include "common/utf8.h"

namespace dllm::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

std::string HttpRequest::header(const std::string& name) const {
  const auto it = headers.find(name);
  return it == headers.end() ? std::string() : std::string(it->value());
}

namespace {

bool is_http_error(const boost::system::error_code& ec) {
  return &ec.category() == &bhttp::make_error_code(bhttp::error::header_limit).category();
}

std::string status_line(int status) {
  const auto reason = bhttp::obsolete_reason(bhttp::int_to_status(static_cast<unsigned>(status)));
  return "HTTP/1.1 " + std::to_string(status) + " " + std::string(reason.empty() ? "Unknown" : reason) + "\r\n";
}

// Handler threads: a fixed set taking tasks in order.
class Workers {
 public:
  explicit Workers(int n) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { loop(); });
  }
  ~Workers() { join(); }
  void post(std::function<void()> f) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      q_.push_back(std::move(f));
    }
    cv_.notify_one();
  }
  void join() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> f;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return quit_ || !q_.empty(); });
        if (q_.empty()) return;
        f = std::move(q_.front());
        q_.pop_front();
      }
      f();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_;
  std::vector<std::thread> threads_;
  bool quit_ = false;
};

}  // namespace

struct HttpServer::Impl {
  struct Conn;

  HttpLimits limits;
  EarlyCheck early;
  Handler handler;
  ErrorBody error_body;
  Logger logger;
  HttpHeaders common;

  asio::io_context io{1};
  // Keeps io.run() going when no operation is pending (the acceptor closed, every connection with a worker):
  // the workers' hand-backs still have to run. stop() ends it.
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(io);
  tcp::acceptor acceptor{io};
  std::thread io_thread;
  std::unique_ptr<Workers> workers;
  std::unordered_set<std::shared_ptr<Conn>> conns;  // asio thread only
  std::atomic<bool> accepting{true};
  std::atomic<size_t> body_memory{0};
  std::atomic<int> busy{0};  // connections held by workers
  std::mutex busy_mu;
  std::condition_variable busy_cv;
  std::atomic<int64_t> write_stop{INT64_MAX};  // Clock ticks: no write waits past it

  void accept();
  void finished_handler() {
    {
      std::lock_guard<std::mutex> lock(busy_mu);
      --busy;
    }
    busy_cv.notify_all();
  }
};

struct HttpServer::Impl::Conn : std::enable_shared_from_this<Conn> {
  Conn(Impl& s, tcp::socket sock) : srv(s), socket(std::move(sock)), timer(s.io), buf(64 << 10) {}

  Impl& srv;
  tcp::socket socket;
  asio::steady_timer timer;
  beast::flat_buffer buf;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser;
  HttpRequest req;
  std::string remote_addr;
  int remote_port = 0;
  size_t reserved = 0;  // of srv.body_memory
  bool in_worker = false, closed = false;
  std::string out;  // an answer the asio thread writes

  // --- the asio thread ---
  void arm(std::chrono::milliseconds d) {
    timer.expires_after(d);
    timer.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec) self->close();  // the phase ran past its deadline: the pending operation ends with an error
    });
  }
  void close() {
    if (closed) return;
    closed = true;
    boost::system::error_code ig;
    timer.cancel();
    socket.shutdown(tcp::socket::shutdown_both, ig);
    socket.close(ig);
    release();
    srv.conns.erase(shared_from_this());
  }
  void release() {
    srv.body_memory -= reserved;
    reserved = 0;
  }

  void read_next(bool first) {
    if (!srv.accepting) return close();
    if (!first && buf.size() == 0) {
      // Keep-alive: the next request's first byte within the idle bound, then its header within its own.
      arm(srv.limits.idle_timeout);
      socket.async_wait(tcp::socket::wait_read, [self = shared_from_this()](const boost::system::error_code& ec) {
        if (self->closed) return;
        if (ec) return self->close();
        self->read_header();
      });
      return;
    }
    read_header();
  }

  void read_header() {
    parser.emplace();
    parser->header_limit(static_cast<uint32_t>(std::min<size_t>(srv.limits.max_header_bytes, UINT32_MAX)));
    parser->body_limit(srv.limits.max_body_bytes);
    req = HttpRequest{};
    req.remote_addr = remote_addr;
    req.remote_port = remote_port;
    req.start = Clock::now();
    arm(srv.limits.header_timeout);
    bhttp::async_read_header(socket, buf, *parser,
                             [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                               self->on_header(ec);
                             });
  }

  // Answers from the asio thread (refusals before a handler runs), then closes.
  void refuse(int status, const std::string& message, const HttpHeaders& extra = {}, std::string body = {}) {
    if (closed) return;
    if (body.empty()) body = srv.error_body(status, message);
    out = status_line(status);
    for (const auto& [k, v] : srv.common) out += k + ": " + v + "\r\n";
    bool typed = false;
    for (const auto& [k, v] : extra) {
      out += k + ": " + v + "\r\n";
      typed = typed || ascii_lower(k) == "content-type";
    }
    if (status == 204 || status == 304) body.clear();  // answers without a body
    if (!typed && !body.empty()) out += "Content-Type: application/json\r\n";
    if (status != 204 && status != 304) out += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    out += "Connection: close\r\n\r\n";
    if (req.method != "HEAD") out += body;
    srv.logger(req, status, std::chrono::duration<double, std::milli>(Clock::now() - req.start).count());
    arm(srv.limits.write_timeout);
    asio::async_write(socket, asio::buffer(out), [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
      if (ec) return self->close();
      self->linger();
    });
  }

  // After a refusal: our side is shut, and what the client still sends (a body never read) is read and
  // dropped for a short while, so that closing does not reset the connection before the answer is read.
  void linger() {
    boost::system::error_code ig;
    socket.shutdown(tcp::socket::shutdown_send, ig);
    arm(std::chrono::milliseconds(1000));
    drain(0);
  }
  void drain(size_t so_far) {
    if (closed) return;
    if (so_far > srv.limits.max_body_bytes + srv.limits.max_header_bytes) return close();
    socket.async_read_some(asio::buffer(scratch), [self = shared_from_this(), so_far](const boost::system::error_code& ec,
                                                                                       size_t n) {
      if (ec) return self->close();
      self->drain(so_far + n);
    });
  }
  char scratch[4096];

  void fill_request() {
    const auto& m = parser->get();
    req.method = std::string(m.method_string());
    req.target = std::string(m.target());
    const size_t q = req.target.find('?');
    req.path = req.target.substr(0, q);
    req.query = q == std::string::npos ? "" : req.target.substr(q + 1);
    req.version = m.version();
    req.headers = m.base();
  }

  void on_header(const boost::system::error_code& ec) {
    timer.cancel();
    if (closed) return;
    if (ec) {
      if (ec == bhttp::error::header_limit) {
        // Still in the request line (no line end yet): the target is what is too long.
        const auto d = buf.data();
        const std::string_view seen(static_cast<const char*>(d.data()), d.size());
        if (seen.find("\r\n") == std::string_view::npos)
          return refuse(414, "the request line is longer than " + std::to_string(srv.limits.max_header_bytes) + " bytes");
        return refuse(431, "the request header is larger than " + std::to_string(srv.limits.max_header_bytes) + " bytes");
      }
      if (ec == bhttp::error::body_limit)
        return refuse(413, "the request body is larger than the limit (" + std::to_string(srv.limits.max_body_bytes) +
                               " bytes)");
      if (is_http_error(ec)) {
        if (ec == bhttp::error::end_of_stream || buf.size() == 0) return close();  // nothing (more) was sent
        return refuse(400, "malformed request (" + ec.message() + ")");
      }
      return close();  // reset, closed, timed out
    }
    fill_request();
    const auto& h = parser->get();
    if (static_cast<size_t>(std::distance(h.begin(), h.end())) > srv.limits.max_header_fields)
      return refuse(431, "the request has more than " + std::to_string(srv.limits.max_header_fields) + " header fields");
    // Framing that two readers could take differently (request smuggling): refused.
    const size_t lengths = h.count(bhttp::field::content_length);
    const bool te = h.count(bhttp::field::transfer_encoding) > 0;
    if (lengths > 1) return refuse(400, "more than one Content-Length");
    if (te && lengths > 0) return refuse(400, "both Content-Length and Transfer-Encoding");
    if (te && (h.count(bhttp::field::transfer_encoding) > 1 || ascii_lower(std::string(h[bhttp::field::transfer_encoding])) != "chunked"))
      return refuse(501, "the only Transfer-Encoding taken is chunked");
    if (lengths == 1) {
      const auto v = h[bhttp::field::content_length];
      if (v.empty() || v.size() > 12 || !std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return refuse(400, "Content-Length is not a number");
    }
    const bool has_body = te || (lengths == 1 && h[bhttp::field::content_length] != "0");
    if ((req.method == "POST" || req.method == "PUT") && !te && lengths == 0)
      return refuse(411, "a " + req.method + " needs a Content-Length (or chunked Transfer-Encoding)");
    if (!srv.accepting) return refuse(503, "the server is shutting down");
    const Early e = srv.early(req);
    if (e.status != 0) return refuse(e.status, "", e.headers, e.body);
    if (!has_body || parser->is_done()) return dispatch();
    // The body's memory, reserved before it is read: its length, or the limit when chunked.
    const size_t want = te ? srv.limits.max_body_bytes : static_cast<size_t>(*parser->content_length());
    if (srv.body_memory.fetch_add(want) + want > srv.limits.max_body_memory) {
      srv.body_memory -= want;
      return refuse(503, "the server is reading too many request bodies at once: try again later",
                    {{"Retry-After", "1"}});
    }
    reserved = want;
    if (ascii_lower(std::string(h[bhttp::field::expect])) == "100-continue") {
      out = "HTTP/1.1 100 Continue\r\n\r\n";
      arm(srv.limits.write_timeout);
      asio::async_write(socket, asio::buffer(out), [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
        self->timer.cancel();
        if (ec || self->closed) return self->close();
        self->read_body();
      });
      return;
    }
    read_body();
  }

  void read_body() {
    arm(srv.limits.body_timeout);
    bhttp::async_read(socket, buf, *parser, [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
      self->timer.cancel();
      if (self->closed) return;
      if (ec == bhttp::error::body_limit)
        return self->refuse(413, "the request body is larger than the limit (" +
                                     std::to_string(self->srv.limits.max_body_bytes) + " bytes)");
      if (ec && is_http_error(ec) && ec != bhttp::error::end_of_stream &&
          ec != bhttp::error::partial_message)
        return self->refuse(400, "malformed request body (" + ec.message() + ")");
      if (ec) return self->close();
      self->dispatch();
    });
  }

  void dispatch();
  void back_from_worker(bool keep_alive);
};

namespace {

// A request's answer, written by its worker straight to the socket.
class SocketExchange : public HttpExchange {
 public:
  SocketExchange(HttpServer::Impl& srv, int fd, const HttpRequest& req, bool keep_alive)
      : srv_(srv), fd_(fd), req_(req), keep_alive_(keep_alive) {}

  void respond(int status, const HttpHeaders& headers, const std::string& body) override {
    if (answered_) return;
    answered_ = true;
    if (!srv_.accepting) keep_alive_ = false;  // shutting down: this connection ends with its answer
    status_ = status;
    std::string out = head(status, headers);
    out += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    if (!keep_alive_) out += "Connection: close\r\n";
    out += "\r\n";
    if (req_.method != "HEAD") out += body;
    send_all(out);
  }
  bool start_stream(int status, const HttpHeaders& headers) override {
    if (answered_) return false;
    answered_ = true;
    status_ = status;
    if (!srv_.accepting) keep_alive_ = false;
    chunked_ = req_.version >= 11;
    if (!chunked_) keep_alive_ = false;  // HTTP/1.0: the answer ends with the connection
    std::string out = head(status, headers);
    if (chunked_) out += "Transfer-Encoding: chunked\r\n";
    if (!keep_alive_) out += "Connection: close\r\n";
    out += "\r\n";
    return send_all(out);
  }
  bool write_chunk(const std::string& data) override {
    if (data.empty()) return !failed_;
    if (!chunked_) return send_all(data);
    char size[32];
    std::snprintf(size, sizeof size, "%zx\r\n", data.size());
    return send_all(size + data + "\r\n");
  }
  bool end_stream() override { return chunked_ ? send_all("0\r\n\r\n") : !failed_; }
  bool client_gone() override {
    if (failed_) return true;
    char c;
    const ssize_t n = recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return true;
    return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  }

  bool answered() const { return answered_; }
  bool failed() const { return failed_; }
  bool keep_alive() const { return keep_alive_ && !failed_; }
  int status() const { return status_; }

 private:
  std::string head(int status, const HttpHeaders& headers) const {
    std::string out = status_line(status);
    for (const auto& [k, v] : srv_.common) out += k + ": " + v + "\r\n";
    for (const auto& [k, v] : headers) out += k + ": " + v + "\r\n";
    return out;
  }
  // All of data, each wait bounded by the write deadline (and the shutdown's).
  bool send_all(const std::string& data) {
    if (failed_) return false;
    const int64_t own = (Clock::now() + srv_.limits.write_timeout).time_since_epoch().count();
    const Clock::time_point deadline{Clock::duration(std::min(own, srv_.write_stop.load()))};
    size_t done = 0;
    while (done < data.size()) {
      const ssize_t n = send(fd_, data.data() + done, data.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        done += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        pollfd p{fd_, POLLOUT, 0};
        if (left > 0 && poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000))) >= 0) continue;
        if (left > 0) continue;
      }
      failed_ = true;
      return false;
    }
    return true;
  }

  HttpServer::Impl& srv_;
  int fd_;
  const HttpRequest& req_;
  bool keep_alive_;
  bool answered_ = false, chunked_ = false, failed_ = false;
  int status_ = 0;
};

}  // namespace

void HttpServer::Impl::Conn::dispatch() {
  req.body = std::move(parser->get().body());
  const bool keep_alive = parser->get().keep_alive();
  in_worker = true;
  {
    std::lock_guard<std::mutex> lock(srv.busy_mu);
    ++srv.busy;
  }
  srv.workers->post([self = shared_from_this(), keep_alive] {
    SocketExchange x(self->srv, self->socket.native_handle(), self->req, keep_alive);
    try {
      self->srv.handler(self->req, x);
    } catch (const std::exception&) {
      // A handler's own failure: a bare 500 (its text stays in the server, never in the answer).
    }
    if (!x.answered()) x.respond(500, {{"Content-Type", "application/json"}}, self->srv.error_body(500, "internal error"));
    self->srv.logger(self->req, x.status(),
                     std::chrono::duration<double, std::milli>(Clock::now() - self->req.start).count());
    const bool again = x.keep_alive();
    asio::post(self->srv.io, [self, again] { self->back_from_worker(again); });
  });
}

void HttpServer::Impl::Conn::back_from_worker(bool keep_alive) {
  in_worker = false;
  release();
  req.body.clear();
  req.body.shrink_to_fit();
  srv.finished_handler();
  if (closed) return;
  if (!keep_alive) return close();
  read_next(false);
}

void HttpServer::Impl::accept() {
  acceptor.async_accept(io, [this](const boost::system::error_code& ec, tcp::socket s) {
    if (ec) {
      if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
      accept();
      return;
    }
    if (!accepting || static_cast<int>(conns.size()) >= limits.max_connections) {
      // No room (or shutting down): a short 503 written without waiting, then closed.
      const std::string body =
          error_body(503, accepting ? "too many connections: try again later" : "the server is shutting down");
      const std::string out = status_line(503) + "Content-Type: application/json\r\nRetry-After: 1\r\nContent-Length: " +
                              std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
      [[maybe_unused]] const ssize_t n = send(s.native_handle(), out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      boost::system::error_code ig;
      s.shutdown(tcp::socket::shutdown_both, ig);
      s.close(ig);
    } else {
      auto c = std::make_shared<Conn>(*this, std::move(s));
      boost::system::error_code ig;
      const auto ep = c->socket.remote_endpoint(ig);
      if (!ig) {
        c->remote_addr = ep.address().to_string();
        c->remote_port = ep.port();
      }
      conns.insert(c);
      c->read_next(true);
    }
    accept();
  });
}

HttpServer::HttpServer(HttpLimits limits, EarlyCheck early, Handler handler, ErrorBody error_body, Logger logger,
                       HttpHeaders common_headers)
    : impl_(std::make_unique<Impl>()) {
  impl_->limits = limits;
  impl_->early = std::move(early);
  impl_->handler = std::move(handler);
  impl_->error_body = std::move(error_body);
  impl_->logger = std::move(logger);
  impl_->common = std::move(common_headers);
}

HttpServer::~HttpServer() { stop(std::chrono::milliseconds(0)); }

int HttpServer::bind(const std::string& host, int port) {
  boost::system::error_code ec;
  const auto addr = asio::ip::make_address(host, ec);
  const std::string where = host + ":" + (port == 0 ? std::string("any port") : std::to_string(port));
  if (ec) throw Error("cannot listen on " + where + " (not an IP address)", Error::kRuntime);
  const tcp::endpoint ep(addr, static_cast<uint16_t>(port));
  impl_->acceptor.open(ep.protocol(), ec);
  if (!ec) impl_->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl_->acceptor.bind(ep, ec);
  if (!ec) impl_->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) throw Error("cannot listen on " + where + " (in use, or not an address here)", Error::kRuntime);
  return impl_->acceptor.local_endpoint().port();
}

void HttpServer::start() {
  impl_->workers = std::make_unique<Workers>(impl_->limits.workers);
  impl_->accept();
  impl_->io_thread = std::thread([this] { impl_->io.run(); });
}

void HttpServer::stop_accepting() {
  impl_->accepting = false;  // now: answers from here on close their connections
  asio::post(impl_->io, [this] {
    boost::system::error_code ig;
    impl_->acceptor.close(ig);
    // Connections between requests stay until stop(): a request that arrives on one meanwhile is answered
    // 503 (Connection: close), and those a handler holds close after their answer.
  });
}

void HttpServer::write_deadline(std::chrono::steady_clock::time_point t) {
  impl_->write_stop = t.time_since_epoch().count();
}

void HttpServer::stop(std::chrono::milliseconds wait) {
  if (!impl_->io_thread.joinable()) return;
  stop_accepting();
  {
    std::unique_lock<std::mutex> lock(impl_->busy_mu);
    impl_->busy_cv.wait_for(lock, wait, [&] { return impl_->busy.load() == 0; });
  }
  // Handlers still writing: their sockets are shut down under them (their writes fail at once).
  write_deadline(Clock::now());
  asio::post(impl_->io, [this] {
    for (const auto& c : impl_->conns) ::shutdown(c->socket.native_handle(), SHUT_RDWR);
  });
  impl_->workers->join();
  asio::post(impl_->io, [this] {
    std::vector<std::shared_ptr<Impl::Conn>> all(impl_->conns.begin(), impl_->conns.end());
    for (const auto& c : all) c->close();
    impl_->io.stop();
  });
  impl_->io_thread.join();
}

}  // namespace dllm::server
