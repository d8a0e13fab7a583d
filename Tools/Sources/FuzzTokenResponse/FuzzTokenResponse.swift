// libFuzzer target for the token endpoint's answer parsers: `TokenResponse.grant(from:)`,
// `TokenResponse.error(from:)` and `RetryAfter.parse(_:)`. (ErrorText, the allow-list the
// error paths are moving to, has its own target: fuzz-error-text.)
//
// Build and run (see Fuzz/README.md and scripts/fuzz.sh):
//   swift build --package-path Tools --product fuzz-token-response --sanitize=fuzzer --sanitize=address \
//       -Xswiftc -sanitize=fuzzer,address --scratch-path .build-fuzz
//   .build-fuzz/debug/fuzz-token-response -dict=Fuzz/token-response.dict CORPUS_COPY
//
// One file, not named main.swift, and no top-level code but one global: under
// `--sanitize=fuzzer` SwiftPM compiles it with -parse-as-library and libFuzzer's `main` runs; in
// a plain build SwiftPM treats the lone file as the entry point, which initializes that global:
// it replays the inputs named on the command line (FuzzReplay).
//
// Input layout:
//   byte 0        the HTTP status, an index into `FuzzInput.statuses`
//   byte 1        the Retry-After header: 0xFF = absent, else the header's length (mod 48)
//   next bytes    the header's text (UTF-8, repaired)
//   the rest      the body
//
// Properties, each a trap with its own message:
//   - RetryAfter.parse never gives a negative delay;
//   - a grant only comes from a 200, with a non-empty access token and expiresIn >= 0;
//   - no error (message, code, description) ever contains the request's secret: the
//     answer carries `FuzzInput.sentinel` in its redactions, and bodies that echo it
//     (the seeds do) must have it scrubbed. Raw only while `FuzzInput.errorsUseErrorText` is
//     false; every form `ErrorText` knows (percent-encoded, JSON-escaped...) once it is true.

import Foundation
import SessionCore
@_spi(Fuzzing) import SessionOAuth
import FuzzReplay

enum FuzzInput {
    /// The refresh token the "request" carried: never to appear in an error.
    static let sentinel = "rt-S3NT1NEL-9f8e7d"
    /// Whether `TokenResponse.error(from:)` and `grant(from:)` go through ErrorText (issue 13):
    /// then their errors are held to every secret form ErrorText knows, not only the raw one.
    /// Set it to true in the change that makes them call ErrorText.
    static let errorsUseErrorText = true
    static let statuses = [
        200, 200, 200, 200, 201, 204, 301, 400, 400, 401, 403, 404, 408, 429, 500, 502,
        503, 504, 599, 100, 0, 600, 418, 302, 200, 400, 429, 503, -1, 999, 200, 401,
    ]
    static let lifetime = Duration.seconds(3600)
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzTokenResponse(_ start: UnsafeRawPointer?, _ count: Int) -> CInt {
    let input = UnsafeRawBufferPointer(start: start, count: count)
    guard input.count >= 2 else { return 0 }
    let status = FuzzInput.statuses[Int(input[0]) % FuzzInput.statuses.count]
    var rest = input.dropFirst(2)
    var header: String?
    if input[1] != 0xFF {
        let length = min(Int(input[1]) % 48, rest.count)
        header = String(decoding: rest.prefix(length), as: UTF8.self)
        rest = rest.dropFirst(length)
    }
    let body = Data(rest)

    let retryAfter = RetryAfter.parse(header)
    if let retryAfter, retryAfter < .zero {
        fatalError("property violated: RetryAfter.parse(\(String(reflecting: header))) = \(retryAfter) < 0")
    }

    let answer = HTTPAnswer(
        status: status, retryAfter: retryAfter, body: body, redactions: [Secret(FuzzInput.sentinel)])
    switch TokenResponse.grant(from: answer, defaultLifetime: FuzzInput.lifetime) {
    case .success(let grant):
        if status != 200 {
            fatalError("property violated: a grant from HTTP \(status)")
        }
        if grant.accessToken.reveal().isEmpty {
            fatalError("property violated: a grant with an empty access token")
        }
        if grant.expiresIn < .zero {
            fatalError("property violated: a grant with expiresIn \(grant.expiresIn) < 0")
        }
    case .failure(let error):
        checkRedacted(error, answer, "grant(from:)")
    }
    checkRedacted(TokenResponse.error(from: answer), answer, "error(from:)")
    return 0
}

/// Traps if the request's secret shows in anything the error says (in any form ErrorText
/// knows, once `FuzzInput.errorsUseErrorText`).
private func checkRedacted(_ error: AuthorityError, _ answer: HTTPAnswer, _ parser: String) {
    let said = [error.message, error.code ?? "", error.description, String(reflecting: error)]
    let secret = Secret(FuzzInput.sentinel)
    guard said.contains(where: {
        FuzzInput.errorsUseErrorText ? ErrorText.containsSecret($0, secrets: [secret]) : $0.contains(FuzzInput.sentinel)
    }) else { return }
    let echoed = answer.body.range(of: Data(FuzzInput.sentinel.utf8)) != nil
    fatalError(
        "property violated: \(parser) leaked the redacted secret (HTTP \(answer.status), "
            + "body \(echoed ? "contains" : "escapes") it): \(error.kind) code=\(error.code ?? "nil")")
}

// A plain build: the entry point runs this global's initializer, which replays the inputs named
// on the command line (Tools/Sources/FuzzReplay). The fuzzer's build (-parse-as-library) has no
// top-level code: this is a lazy global nobody reads, so it never runs there.
let replayed: Never = replay(fuzzTokenResponse)
