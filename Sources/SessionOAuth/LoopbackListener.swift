import CLibUV
import CLoopHTTP
import LoopFlow
import SessionCore

/// A one-shot HTTP listener on 127.0.0.1 at an ephemeral port, served by the loop (no thread
/// of its own): the loopback redirect of a browser sign-in (RFC 8252 §7.3). Each request's
/// method and target go to `onRequest`, whose reply (a status and an HTML page) is written
/// back with `Connection: close`. Sources/CLoopHTTP/loop_listener.c holds the limits (head
/// size, connections, deadline).
///
/// Loop-confined: made, used and closed on the loop thread. `close()` frees the port within
/// the call; the loop's teardown closes it too.
final class LoopbackListener: @unchecked Sendable {
    struct Reply {
        var status: Int
        var page: String
        /// A Location header (a 302's target).
        var location: String? = nil
    }

    let port: Int
    private let loop: EventLoop
    // Loop-confined.
    private var listener: OpaquePointer?
    private var handler: Unmanaged<LoopbackHandler>?
    /// The loop's teardown hook, removed when the listener closes first.
    private var hook: UInt64?

    /// Loop thread. Listens at once.
    /// - Throws: `SessionError(.configuration)` when no loopback port can be had (libuv's reason).
    init(loop: EventLoop, onRequest: @escaping (_ method: String, _ target: String) -> Reply) throws(SessionError) {
        loop.assertInEventLoop()
        self.loop = loop
        let handler = Unmanaged.passRetained(LoopbackHandler(onRequest))
        var listener: OpaquePointer?
        var port: Int32 = 0
        let rc = ll_listen(loop.uvLoop, loopbackRequest, handler.toOpaque(), &listener, &port)
        guard rc == 0, let listener else {
            handler.release()
            throw SessionError(.configuration, "cannot listen on 127.0.0.1 for the redirect: \(String(cString: uv_strerror(rc)))")
        }
        self.port = Int(port)
        self.listener = listener
        self.handler = handler
        hook = loop.addRemovableTeardownHook({ [weak self] in self?.close() })
        if hook == nil { close() }
    }

    /// Whether it still listens (loop thread).
    var isListening: Bool { listener != nil }

    /// Connections open while it listens (loop thread; 0 once closed, though a reply being
    /// sent may still hold one until it is shut down).
    var connections: Int { listener.map { ll_connections($0) } ?? 0 }

    /// Loop thread, any number of times: the port is closed when it returns; no request is
    /// handed on afterwards (a reply being written is finished).
    func close() {
        if let hook {
            self.hook = nil
            loop.removeTeardownHook(hook)
        }
        guard let listener else { return }
        self.listener = nil
        ll_close(listener)
        handler?.release()
        handler = nil
    }

    deinit {
        if let hook { loop.removeTeardownHook(hook) }
        // Made and dropped on the loop thread (its owner is loop-confined).
        if let listener {
            ll_close(listener)
            handler?.release()
        }
    }
}

/// Holds `onRequest` for the C callback (retained while the listener listens).
private final class LoopbackHandler {
    let onRequest: (_ method: String, _ target: String) -> LoopbackListener.Reply
    init(_ onRequest: @escaping (String, String) -> LoopbackListener.Reply) { self.onRequest = onRequest }
}

private func loopbackRequest(
    _ method: UnsafePointer<CChar>?, _ target: UnsafePointer<CChar>?, _ reply: UnsafeMutablePointer<ll_reply>?,
    _ userdata: UnsafeMutableRawPointer?
) {
    guard let method, let target, let reply, let userdata else { return }
    // Borrowed: the listener keeps the handler retained while it may call back.
    let handler = Unmanaged<LoopbackHandler>.fromOpaque(userdata).takeUnretainedValue()
    let answer = handler.onRequest(String(cString: method), String(cString: target))
    var page = Array(answer.page.utf8)
    page.withUnsafeMutableBytes { bytes in
        ll_reply_set(reply, Int32(answer.status), bytes.baseAddress?.assumingMemoryBound(to: CChar.self), bytes.count)
    }
    if let location = answer.location { ll_reply_set_location(reply, location) }
}

/// What the loopback listener and the browser flow read from bytes any local process may send,
/// for the fuzz target (Tools/Sources/FuzzLoopbackRequest) and tests: not API.
@_spi(Fuzzing) public enum LoopbackRequestParsing {
    /// The request line of `head` as the listener reads it (`ll_parse_request_line`), or nil
    /// (the listener answers 400).
    public static func requestLine(_ head: [UInt8]) -> (method: String, target: String)? {
        var buffer = head + [0]
        return buffer.withUnsafeMutableBufferPointer { bytes -> (String, String)? in
            var method: UnsafePointer<CChar>?
            var target: UnsafePointer<CChar>?
            let rc = bytes.baseAddress!.withMemoryRebound(to: CChar.self, capacity: bytes.count) {
                ll_parse_request_line($0, head.count, &method, &target)
            }
            guard rc == 0, let method, let target else { return nil }
            return (String(cString: method), String(cString: target))
        }
    }

    /// The path and the decoded query fields of a request target, as the browser flow reads
    /// the redirect (`?code=..&state=..`).
    public static func callback(_ target: String) -> (path: String, fields: [(String, String)]?) {
        let (path, query) = BrowserRedirect.split(target)
        return (path, query.map(BrowserRedirect.parseQuery))
    }

    /// A server's text as the browser page shows it: printable, bounded, HTML-escaped.
    public static func shown(_ text: String, limit: Int) -> String {
        BrowserRedirect.html(BrowserRedirect.printable(text, limit: limit))
    }
}
