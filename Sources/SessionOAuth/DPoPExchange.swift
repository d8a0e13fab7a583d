import FoundationEssentials
import LoopFlow
import SessionCore

/// Something in flight that can be ended (a request, or a request and its retry).
protocol HTTPCancellable: AnyObject, Sendable {
    /// Ends it if still running (any thread): its handler gets `cancelled` (or what arrived).
    func cancel()
}

extension HTTPCall: HTTPCancellable {}

/// A token-endpoint POST with a DPoP proof (RFC 9449 §5), and its one nonce retry (§8): an
/// answer `use_dpop_nonce` with a `DPoP-Nonce` is sent again at once with a new proof carrying
/// that nonce — once. The server refused that request before looking at its grant, so the
/// refresh token (or code, or device code) sent again is the one it never used: no rotated
/// token is ever sent twice. A second `use_dpop_nonce` is the configuration error
/// `use_dpop_nonce` (a server that demands a new nonce every time makes no client loop). Any
/// `DPoP-Nonce` on an answer is remembered for that server (`DPoPNonces.shared`), and the
/// first proof carries the nonce remembered.
///
/// Loop-confined; `cancel()` from any thread ends the request in flight (and no retry starts).
final class DPoPExchange: HTTPCancellable, @unchecked Sendable {
    private let loop: EventLoop
    private let url: URL
    private let key: DPoPKey
    private let post: Post
    private let done: @Sendable (Result<HTTPAnswer, AuthorityError>) -> Void
    // Loop-confined.
    private var current: HTTPCall?
    private var cancelled = false

    /// Sends the request with a `DPoP:` header line (the proof itself given too: an answer
    /// that echoes it must not carry it into an error); its handler runs on the loop thread.
    typealias Post = (_ line: Secret, _ proof: Secret, @escaping @Sendable (Result<HTTPAnswer, AuthorityError>) -> Void) -> HTTPCall

    /// Starts it (loop thread).
    init(
        loop: EventLoop, url: URL, key: DPoPKey, post: @escaping Post,
        done: @escaping @Sendable (Result<HTTPAnswer, AuthorityError>) -> Void
    ) {
        self.loop = loop
        self.url = url
        self.key = key
        self.post = post
        self.done = done
        loop.assertInEventLoop()
        send(nonce: DPoPNonces.shared.nonce(for: url.absoluteString), retried: false)
    }

    private func send(nonce: String?, retried: Bool) {
        let proof: Secret
        do {
            proof = try key.proof(method: "POST", url: url.absoluteString, nonce: nonce)
        } catch {
            // Reported on a later turn, as a request's answer would be.
            let failure = AuthorityError.configuration("invalid_dpop_proof", error.message)
            if (try? loop.execute({ [done] in done(.failure(failure)) })) == nil { done(.failure(failure)) }
            return
        }
        current = post(Self.line("DPoP: ", proof), proof) { [self] outcome in
            current = nil
            guard case .success(let answer) = outcome else { return done(outcome) }
            // A value no proof can carry is not remembered (it would fail every later proof).
            let usable = answer.dpopNonce.map { DPoPNonces.shared.remember($0, for: url.absoluteString) } ?? false
            guard (400...401).contains(answer.status), TokenResponse.error(from: answer).code == "use_dpop_nonce" else {
                return done(outcome)
            }
            if cancelled { return done(.failure(.cancelled)) }
            guard !retried, let given = answer.dpopNonce, given != nonce, usable else {
                let why = retried
                    ? "the server demanded a new DPoP nonce again after one retry with the nonce it gave"
                    : answer.dpopNonce != nil && !usable
                    ? "the server's DPoP nonce (DPoP-Nonce) is not a string of NQCHARs (RFC 9449 §4.2)"
                    : "the server demands a DPoP nonce but gave none that is new (DPoP-Nonce)"
                return done(.failure(AuthorityError(
                    .configuration, code: "use_dpop_nonce", message: "HTTP \(answer.status): use_dpop_nonce: \(why)")))
            }
            send(nonce: given, retried: true)
        }
    }

    func cancel() {
        if loop.inEventLoop {
            cancelOnLoop()
        } else {
            try? loop.execute { [self] in cancelOnLoop() }
        }
    }

    private func cancelOnLoop() {
        cancelled = true
        current?.cancel()
    }

    /// `prefix` then `secret`, in a secret's own memory (a header line).
    static func line(_ prefix: String, _ secret: Secret) -> Secret {
        let head = Array(prefix.utf8)
        return Secret(count: head.count + secret.count) { out in
            for (index, byte) in head.enumerated() { out[index] = byte }
            secret.withUnsafeBytes { bytes in
                for (index, byte) in bytes.enumerated() { out[head.count + index] = byte }
            }
        }
    }
}
