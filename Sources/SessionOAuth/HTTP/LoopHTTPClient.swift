import CLoopHTTP

#if canImport(Glibc)
import Glibc
#endif
import LoopFlow
import SessionCore

/// The request methods the client speaks.
enum HTTPMethod: Sendable {
    /// A form POST (token, revocation, introspection endpoints).
    case post
    /// A GET without a body (metadata discovery).
    case get
}

/// A request as the OAuth client sends it: a POST with a body, or a GET (`method`, body empty).
struct HTTPPost: Sendable {
    var url: String
    var headers: [String]
    /// A header line that carries a secret (`Authorization: Bearer ...`), sent after `headers`.
    var secretHeader: Secret? = nil
    /// The form body, in memory a secret owns (the C side zeroes its copy when the request ends).
    var body: Secret
    /// The overall deadline.
    var timeout: Duration
    var maximumAnswerSize: Int
    /// Plain http is allowed (the URL was checked to be loopback at configuration).
    var allowsLoopbackHTTP: Bool
    /// POST (the default) or GET; a GET has an empty body.
    var method: HTTPMethod = .post
}

/// A complete HTTP answer.
struct HTTPResponse: Sendable {
    let status: Int
    /// The body, in memory a secret owns: a token answer's tokens are read from it in place.
    let body: Secret
    let retryAfter: String?

    /// A copy of the body, for answers that carry no secret (metadata).
    var bytes: [UInt8] { body.withUnsafeBytes { Array($0) } }
}

/// Why a request produced no answer.
enum HTTPFailure: Error, Sendable, Equatable {
    case cancelled
    case timedOut
    /// The answer was larger than the limit (announced, or `received` bytes so far).
    case tooLarge(received: Int64)
    case network(String)
    case refused(String)
}

/// One request in flight; `cancel()` from any thread (hops to the loop).
final class HTTPCall: @unchecked Sendable {
    fileprivate let loop: EventLoop
    // Loop-confined: the C request while it runs.
    fileprivate var request: OpaquePointer?
    fileprivate var cancelledBeforeStart = false
    fileprivate let done: @Sendable (Result<HTTPResponse, HTTPFailure>) -> Void

    fileprivate init(loop: EventLoop, done: @escaping @Sendable (Result<HTTPResponse, HTTPFailure>) -> Void) {
        self.loop = loop
        self.done = done
    }

    /// Ends the request if it is still running: `done` gets `.cancelled` (or the answer, if
    /// it ended first). Safe from any thread, any number of times.
    func cancel() {
        if loop.inEventLoop {
            cancelOnLoop()
        } else {
            // A loop that is shutting down closes the client, which cancels every request.
            try? loop.execute { [self] in cancelOnLoop() }
        }
    }

    private func cancelOnLoop() {
        if let request {
            self.request = nil
            lh_cancel(request)  // runs `finished` inside
        } else {
            cancelledBeforeStart = true
        }
    }

    /// Loop thread, from the C callback: exactly once per started request.
    fileprivate func finished(_ answer: UnsafePointer<lh_answer>) {
        request = nil
        let answer = answer.pointee
        let result: Result<HTTPResponse, HTTPFailure>
        switch answer.outcome {
        case LH_ANSWERED:
            // Copied into memory of its own; the C side zeroes its buffer when this returns.
            let body = answer.body_length == 0 || answer.body == nil
                ? Secret("") : Secret(copying: UnsafeRawBufferPointer(start: answer.body, count: answer.body_length))
            result = .success(HTTPResponse(
                status: answer.status, body: body, retryAfter: answer.retry_after.map { String(cString: $0) }))
        case LH_CANCELLED:
            result = .failure(.cancelled)
        case LH_TIMED_OUT:
            result = .failure(.timedOut)
        case LH_TOO_LARGE:
            result = .failure(.tooLarge(received: answer.bytes_received))
        case LH_REFUSED:
            result = .failure(.refused(answer.error_text.map { String(cString: $0) } ?? "refused"))
        default:
            result = .failure(.network(answer.error_text.map { String(cString: $0) } ?? "network error"))
        }
        done(result)
    }
}

/// The HTTP client on an `EventLoop`: libcurl's multi interface driven by the loop
/// (Sources/CLoopHTTP). Requests start, run and end on the loop thread; `done` runs there.
/// The client is made on first use and closed when the loop is torn down, or when its
/// owner lets go of it (every request still running ends as `.cancelled`).
final class LoopHTTPClient: @unchecked Sendable {
    let loop: EventLoop
    // Loop-confined.
    private var client: OpaquePointer?
    private var closed = false

    /// The loop's teardown hook (removed when the client goes first).
    private var hook: UInt64?

    init(loop: EventLoop) {
        self.loop = loop
        hook = loop.addRemovableTeardownHook({ [weak self] in self?.close() })
        if hook == nil { closed = true }
    }

    deinit {
        if let hook { loop.removeTeardownHook(hook) }
        // The C client lives on the loop: closed there (its requests end as cancelled).
        guard let client else { return }
        let handle = ClientHandle(pointer: client)
        if loop.inEventLoop {
            lh_client_close(handle.pointer)
        } else {
            try? loop.execute { lh_client_close(handle.pointer) }
        }
    }

    private struct ClientHandle: @unchecked Sendable {
        let pointer: OpaquePointer
    }

    /// Starts a POST, or a GET when `post.method` says so (any thread; the work happens on the loop). `done` runs exactly once,
    /// on the loop thread, never inside this call.
    @discardableResult
    func post(_ post: HTTPPost, done: @escaping @Sendable (Result<HTTPResponse, HTTPFailure>) -> Void) -> HTTPCall {
        let call = HTTPCall(loop: loop, done: done)
        do {
            try loop.execute { [self] in start(post, call) }
        } catch {
            done(.failure(.refused("the event loop is shut down")))
        }
        return call
    }

    /// Loop thread.
    private func start(_ post: HTTPPost, _ call: HTTPCall) {
        guard !call.cancelledBeforeStart else { return call.done(.failure(.cancelled)) }
        guard !closed else { return call.done(.failure(.refused("the event loop is shutting down"))) }
        if client == nil {
            client = lh_client_create(loop.uvLoop)
            guard client != nil else { return call.done(.failure(.refused("libcurl could not start"))) }
        }
        let context = Unmanaged.passRetained(call)
        var request: OpaquePointer?
        let rc = withCStrings(post.headers, secret: post.secretHeader) { headers in
            post.url.withCString { url in
                post.body.withUnsafeBytes { body in
                    var options = lh_post_options(
                        url: url, headers: headers, body: body.baseAddress, body_length: body.count,
                        timeout_ms: max(post.timeout.milliseconds, 1), connect_timeout_ms: 0,
                        max_body: Int64(post.maximumAnswerSize), allow_loopback_http: post.allowsLoopbackHTTP ? 1 : 0)
                    switch post.method {
                    case .post:
                        return lh_post(client, &options, httpCallFinished, context.toOpaque(), &request)
                    case .get:
                        options.body = nil
                        options.body_length = 0
                        return lh_get(client, &options, httpCallFinished, context.toOpaque(), &request)
                    }
                }
            }
        }
        guard rc == 0, let request else {
            context.release()
            return call.done(.failure(.refused("the request could not be started (URL or memory)")))
        }
        call.request = request
    }

    /// Requests running (loop thread).
    var running: Int { client.map { lh_client_running($0) } ?? 0 }

    /// Loop thread: ends every request (`.cancelled`) and closes the handles.
    private func close() {
        closed = true
        if let client {
            self.client = nil
            lh_client_close(client)
        }
    }
}

private func httpCallFinished(_ answer: UnsafePointer<lh_answer>?, _ userdata: UnsafeMutableRawPointer?) {
    guard let answer, let userdata else { return }
    Unmanaged<HTTPCall>.fromOpaque(userdata).takeRetainedValue().finished(answer)
}

/// `strings` (then `secret`, in place: no copy) as a NULL-terminated array of C strings, for
/// the duration of `body`.
private func withCStrings<T>(
    _ strings: [String], secret: Secret?, _ body: (UnsafePointer<UnsafePointer<CChar>?>) -> T
) -> T {
    let copies = strings.map { strdup($0) }
    defer { copies.forEach { free($0) } }
    var pointers: [UnsafePointer<CChar>?] = copies.map { UnsafePointer($0) }
    func run(_ secretLine: UnsafePointer<CChar>?) -> T {
        if let secretLine { pointers.append(secretLine) }
        pointers.append(nil)
        return pointers.withUnsafeBufferPointer { body($0.baseAddress!) }
    }
    guard let secret else { return run(nil) }
    return secret.withCString { run($0) }
}

extension Duration {
    /// Whole milliseconds, rounded up (a deadline never shrinks to 0).
    var milliseconds: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1000 + (attoseconds + 999_999_999_999_999) / 1_000_000_000_000_000
    }
}
