import CLoopHTTP

#if canImport(Glibc)
import Glibc
#endif
import LoopFlow
import SessionCore

/// One request as the OAuth client sends it: a form POST with a body (token, revocation,
/// introspection, device authorization endpoints) or a GET without one (metadata discovery,
/// userinfo). Both go through `LoopHTTPClient.send`, under the same rules and limits.
struct HTTPRequest: Sendable {
    /// The request methods the client speaks.
    enum Method: Sendable {
        /// A POST of `body`.
        case post(body: Secret)
        /// A GET without a body.
        case get
    }

    var method: Method
    var url: String
    var headers: [String]
    /// Header lines that carry a secret (`Authorization: Bearer ...`, `DPoP: <proof>`), sent
    /// after `headers`.
    var secretHeaders: [Secret] = []
    /// The overall deadline.
    var timeout: Duration
    var maximumAnswerSize: Int
    /// Plain http is allowed (the URL was checked to be loopback at configuration).
    var allowsLoopbackHTTP: Bool
    /// The rule for an answer that is arriving (a refresh's, whose token the server has
    /// rotated): once a 2xx status line has arrived, `timeout` no longer ends the request —
    /// only no byte for `stall`, or `cap` from its start — and `arriving` is told (loop thread).
    /// A failure after that status line is `.answerLost`. Nil: `timeout` applies throughout.
    var answerRule: AnswerRule? = nil

    struct AnswerRule: Sendable {
        var stall: Duration
        var cap: Duration
        var arriving: @Sendable () -> Void
    }
}

/// A complete HTTP answer.
struct HTTPResponse: Sendable {
    let status: Int
    /// The body, in memory a secret owns: a token answer's tokens are read from it in place.
    let body: Secret
    let retryAfter: String?
    /// The DPoP-Nonce header's value (RFC 9449 §8), if any.
    var dpopNonce: String? = nil

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
    /// A 2xx status line arrived, then the request ended without the whole answer (stalled,
    /// cut off, cancelled, the cap): only with an `answerRule`.
    case answerLost(status: Int, String)
}

/// One request in flight; `cancel()` from any thread (hops to the loop).
final class HTTPCall: @unchecked Sendable {
    fileprivate let loop: EventLoop
    // Loop-confined: the C request while it runs.
    fileprivate var request: OpaquePointer?
    fileprivate var cancelledBeforeStart = false
    fileprivate let done: @Sendable (Result<HTTPResponse, HTTPFailure>) -> Void
    fileprivate let arriving: (@Sendable () -> Void)?

    fileprivate init(
        loop: EventLoop, arriving: (@Sendable () -> Void)? = nil,
        done: @escaping @Sendable (Result<HTTPResponse, HTTPFailure>) -> Void
    ) {
        self.loop = loop
        self.arriving = arriving
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
                status: answer.status, body: body, retryAfter: answer.retry_after.map { String(cString: $0) },
                dpopNonce: answer.dpop_nonce.map { String(cString: $0) }))
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
        if arriving != nil, (200...299).contains(answer.status_line), case .failure(let failure) = result,
            failure != .tooLarge(received: answer.bytes_received)
        {
            let how = answer.error_text.map { String(cString: $0) } ?? "\(failure)"
            done(.failure(.answerLost(status: answer.status_line, how)))
            return
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

    /// Starts `request` (any thread). `done` runs exactly once, on the loop thread, never
    /// inside this call. On the loop thread the request starts at once; from another thread
    /// it starts on the loop's next turn.
    @discardableResult
    func send(_ request: HTTPRequest, done: @escaping @Sendable (Result<HTTPResponse, HTTPFailure>) -> Void) -> HTTPCall {
        let call = HTTPCall(loop: loop, arriving: request.answerRule?.arriving, done: done)
        if loop.inEventLoop {
            guard let refusal = start(request, call) else { return call }
            // The one re-post that stays: a refusal is known now, but `done` must not run inside
            // this call (callers keep the returned call and finish their bookkeeping after it
            // returns), so it is reported on a later turn. Only if the loop takes no more work
            // (it is being torn down) is it reported here, so that it is reported at all.
            if (try? loop.execute({ done(.failure(refusal)) })) == nil { done(.failure(refusal)) }
            return call
        }
        do {
            try loop.execute { [self] in
                if let refusal = start(request, call) { call.done(.failure(refusal)) }
            }
        } catch {
            done(.failure(.refused("the event loop is shut down")))
        }
        return call
    }

    /// Loop thread: starts `request` for `call`; the refusal if it did not start (the caller
    /// reports it: `done` never runs inside this function).
    private func start(_ request: HTTPRequest, _ call: HTTPCall) -> HTTPFailure? {
        guard !call.cancelledBeforeStart else { return .cancelled }
        guard !closed else { return .refused("the event loop is shutting down") }
        if client == nil {
            client = lh_client_create(loop.uvLoop)
            guard client != nil else { return .refused("libcurl could not start") }
        }
        let context = Unmanaged.passRetained(call)
        var started: OpaquePointer?
        let rc = withCStrings(request.headers, secrets: request.secretHeaders) { headers in
            request.url.withCString { url in
                let timeout = max(request.timeout.milliseconds, 1)
                var options = lh_post_options(
                    url: url, headers: headers, body: nil, body_length: 0,
                    timeout_ms: timeout, connect_timeout_ms: 0,
                    max_body: Int64(request.maximumAnswerSize), allow_loopback_http: request.allowsLoopbackHTTP ? 1 : 0,
                    answer_stall_ms: request.answerRule.map { max($0.stall.milliseconds, 1) } ?? 0,
                    answer_cap_ms: request.answerRule.map { max($0.cap.milliseconds, timeout) } ?? 0,
                    on_status: request.answerRule == nil ? nil : httpCallArriving)
                switch request.method {
                case .post(let body):
                    return body.withUnsafeBytes { bytes in
                        options.body = bytes.baseAddress
                        options.body_length = bytes.count
                        return lh_post(client, &options, httpCallFinished, context.toOpaque(), &started)
                    }
                case .get:
                    return lh_get(client, &options, httpCallFinished, context.toOpaque(), &started)
                }
            }
        }
        guard rc == 0, let started else {
            context.release()
            return .refused("the request could not be started (URL or memory)")
        }
        call.request = started
        return nil
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

private func httpCallArriving(_ status: Int, _ userdata: UnsafeMutableRawPointer?) {
    guard let userdata else { return }
    Unmanaged<HTTPCall>.fromOpaque(userdata).takeUnretainedValue().arriving?()
}

private func httpCallFinished(_ answer: UnsafePointer<lh_answer>?, _ userdata: UnsafeMutableRawPointer?) {
    guard let answer, let userdata else { return }
    Unmanaged<HTTPCall>.fromOpaque(userdata).takeRetainedValue().finished(answer)
}

/// `strings` (then `secrets`, in place: no copy) as a NULL-terminated array of C strings, for
/// the duration of `body`.
private func withCStrings<T>(
    _ strings: [String], secrets: [Secret], _ body: (UnsafePointer<UnsafePointer<CChar>?>) -> T
) -> T {
    let copies = strings.map { strdup($0) }
    defer { copies.forEach { free($0) } }
    var pointers: [UnsafePointer<CChar>?] = copies.map { UnsafePointer($0) }
    func run(_ remaining: ArraySlice<Secret>) -> T {
        guard let secret = remaining.first else {
            pointers.append(nil)
            return pointers.withUnsafeBufferPointer { body($0.baseAddress!) }
        }
        return secret.withCString { line in
            pointers.append(line)
            return run(remaining.dropFirst())
        }
    }
    return run(secrets[...])
}
