// The libcurl wrapper: GET into memory or streamed, HTTP(S) only, redirects followed, the bearer token sent to
// the endpoint's host only, stalls detected, and failures turned into messages that say what to do.
#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <mutex>

#include "hub/internal.h"
#include "common/interrupt.h"
#include "common/utf8.h"

namespace dllm::hub {

namespace {

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) throw Error("cannot initialise libcurl");
  });
}

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return "";
  size_t b = s.find_last_not_of(" \t\r\n");
  return s.substr(a, b - a + 1);
}

// State shared with libcurl's callbacks for one transfer.
struct Transfer {
  Headers headers;
  StreamHandlers* handlers = nullptr;
  CURL* curl = nullptr;
  bool started = false;     // on_start was called
  bool aborted = false;     // a handler returned false
  long status = 0;
};

size_t on_header(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::string line(data, size * n);
  if (line.rfind("HTTP/", 0) == 0) {
    t->headers.clear();  // a new response (after a redirect or a 100 Continue): keep the last one's only
  } else {
    size_t colon = line.find(':');
    if (colon != std::string::npos) t->headers[ascii_lower(trim(line.substr(0, colon)))] = trim(line.substr(colon + 1));
  }
  return size * n;
}

bool start(Transfer* t) {
  if (t->started) return !t->aborted;
  t->started = true;
  curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &t->status);
  if (!t->handlers->on_start(t->status, t->headers)) t->aborted = true;
  return !t->aborted;
}

size_t on_body(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  if (!start(t)) return 0;
  if (!t->handlers->on_data(data, size * n)) {
    t->aborted = true;
    return 0;
  }
  return size * n;
}

// Polled by libcurl a few times a second: a non-zero answer stops the transfer (Ctrl-C, common/interrupt.h).
int on_progress(void*, curl_off_t, curl_off_t, curl_off_t, curl_off_t) { return interrupted() ? 1 : 0; }

bool is_unreachable(CURLcode rc) {
  return rc == CURLE_COULDNT_RESOLVE_HOST || rc == CURLE_COULDNT_RESOLVE_PROXY || rc == CURLE_COULDNT_CONNECT;
}

}  // namespace

std::string host_of(const std::string& url) {
  size_t a = url.find("://");
  a = a == std::string::npos ? 0 : a + 3;
  size_t b = url.find_first_of("/?#", a);
  return url.substr(a, b == std::string::npos ? std::string::npos : b - a);
}

std::string origin_of(const std::string& url) {
  size_t colon = url.find("://");
  if (colon == std::string::npos || colon == 0) return "";
  std::string scheme = ascii_lower(url.substr(0, colon));
  std::string host = ascii_lower(host_of(url));
  if (size_t at = host.rfind('@'); at != std::string::npos) host = host.substr(at + 1);  // user:pass@
  size_t port_colon = host.rfind(':');
  if (port_colon == std::string::npos || host.find(']', port_colon) != std::string::npos) {
    if (scheme == "https") host += ":443";
    else if (scheme == "http") host += ":80";
  }
  return scheme + "://" + host;
}

long http_stream(const Options& opts, const std::string& url, uint64_t from, StreamHandlers& handlers) {
  global_init();
  CURL* curl = curl_easy_init();
  if (!curl) throw Error("cannot create a libcurl handle");
  Transfer t;
  t.handlers = &handlers;
  t.curl = curl;
  char errbuf[CURL_ERROR_SIZE] = {0};
  std::string range = std::to_string(from) + "-";
  const bool https = ascii_lower(url.substr(0, 8)) == "https://";
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(curl, CURLOPT_MAXREDIRS, 10L);
#if LIBCURL_VERSION_NUM >= 0x075500
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  // A redirect never downgrades https to http.
  curl_easy_setopt(curl, CURLOPT_REDIR_PROTOCOLS_STR, https ? "https" : "http,https");
#else
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS, long(CURLPROTO_HTTP | CURLPROTO_HTTPS));
  curl_easy_setopt(curl, CURLOPT_REDIR_PROTOCOLS, https ? long(CURLPROTO_HTTPS) : long(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
  curl_easy_setopt(curl, CURLOPT_USERAGENT, "dllm/0.1 (libcurl)");
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, 20L);
  // A transfer that moves less than 1 kB/s for stall_seconds has stalled: fail it (a download is resumed later).
  // A server trickling a byte a second can no longer hold a pull forever.
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, kStallBytesPerSecond);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, std::max(1L, opts.stall_seconds));
  curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &t);
  if (from > 0) curl_easy_setopt(curl, CURLOPT_RANGE, range.c_str());
  if (!opts.token.empty() && origin_of(url) == origin_of(opts.endpoint)) {
    // The token goes only to requests that start at the endpoint's own scheme, host and port; libcurl sends
    // credentials set this way to that first origin only, never to the one a redirect names (the hub redirects
    // file downloads to a CDN).
    curl_easy_setopt(curl, CURLOPT_HTTPAUTH, long(CURLAUTH_BEARER));
    curl_easy_setopt(curl, CURLOPT_XOAUTH2_BEARER, opts.token.c_str());
  }
  CURLcode rc = curl_easy_perform(curl);
  if (rc == CURLE_OK) start(&t);  // a response without a body (404 with no text, 416) still reaches on_start
  curl_easy_cleanup(curl);
  throw_if_interrupted();
  if (t.aborted) return t.status;
  if (rc != CURLE_OK) {
    std::string why = errbuf[0] ? errbuf : curl_easy_strerror(rc);
    if (is_unreachable(rc)) throw NetworkError("cannot reach " + host_of(url) + " (" + why + ")", true);
    // Permanent: retrying cannot help, so these are not NetworkErrors (which are retried).
    if (rc == CURLE_UNSUPPORTED_PROTOCOL)
      throw Error("refused to fetch " + url + ": it is, or redirects to, a URL that is not http or https (" + why + ")");
    if (rc == CURLE_TOO_MANY_REDIRECTS)
      throw Error("too many redirects fetching " + url + " (a redirect loop?): " + why);
    if (rc == CURLE_OPERATION_TIMEDOUT)
      throw NetworkError("the transfer from " + host_of(url) + " stalled: less than " +
                             std::to_string(kStallBytesPerSecond) + " bytes/s for " + std::to_string(opts.stall_seconds) +
                             " s (DLLM_STALL_TIMEOUT sets how long)", false);
    throw NetworkError("the transfer from " + host_of(url) + " failed: " + why, false);
  }
  return t.status;
}

HttpResponse http_get(const Options& opts, const std::string& url, size_t max_body) {
  HttpResponse r;
  bool too_big = false;
  StreamHandlers h;
  h.on_start = [&](long status, const Headers& headers) {
    r.status = status;
    r.headers = headers;
    return true;
  };
  h.on_data = [&](const char* data, size_t n) {
    if (r.body.size() + n > max_body) {
      too_big = true;
      return false;
    }
    r.body.append(data, n);
    return true;
  };
  http_stream(opts, url, 0, h);
  if (too_big) throw Error("the answer from " + url + " is larger than " + format_bytes(max_body));
  return r;
}

bool looks_like_html(const Headers& headers, const std::string& first_bytes) {
  auto it = headers.find("content-type");
  if (it != headers.end() && ascii_lower(it->second).find("text/html") != std::string::npos) return true;
  std::string head = ascii_lower(trim(first_bytes.substr(0, 256)));
  return head.rfind("<!doctype", 0) == 0 || head.rfind("<html", 0) == 0 || head.rfind("<head", 0) == 0;
}

std::string http_status_message(long status, const Headers& headers, const std::string& body,
                                const std::string& what, const Options& opts) {
  std::string detail;
  if (auto it = headers.find("x-error-message"); it != headers.end()) detail = it->second;
  std::string code = std::to_string(status);
  std::string msg;
  auto code_it = headers.find("x-error-code");
  if ((status == 401 || status == 403) && code_it != headers.end() && code_it->second == "GatedRepo") {
    msg = what + " is gated (" + code + "): accept its terms on its page at " + opts.endpoint + ", then set " +
          "HF_TOKEN to a token of that account";
  } else if (status == 401) {
    msg = "the hub refused access to " + what + " (401 Unauthorized): it is private, gated, or does not exist; ";
    msg += opts.token.empty() ? "set HF_TOKEN to a token that can read it"
                              : "the token in HF_TOKEN is not accepted for it";
  } else if (status == 403) {
    msg = "access to " + what + " is forbidden (403): a gated model needs its terms accepted on its page, and "
          "HF_TOKEN set to a token of that account";
  } else if (status == 404) {
    msg = what + " was not found on " + opts.endpoint + " (404)";
  } else if (status == 429) {
    msg = "the hub is rate-limiting requests for " + what + " (429): wait a minute and try again";
  } else if (status >= 500) {
    msg = "the hub failed to serve " + what + " (" + code + "): try again later";
  } else {
    msg = "unexpected HTTP status " + code + " for " + what;
  }
  if (detail.empty() && !body.empty() && !looks_like_html(headers, body) && body.size() < 300)
    detail = trim(body);
  if (!detail.empty()) msg += " [hub: " + detail + "]";
  return msg;
}

}  // namespace dllm::hub
