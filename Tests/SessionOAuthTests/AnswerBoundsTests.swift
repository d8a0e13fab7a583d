import Foundation
import SessionCore
import Testing

@_spi(Fuzzing) @testable import SessionOAuth

/// Issue 29, point 5: each secret a server's answer is read into is memory of its own (a
/// page, `SecretBytes`), so the number an answer can make is bounded: 1 MiB of
/// `"id_token":"",` made 74 896 secrets and took RSS from 17 to 333 MB.
@Suite("What a server's answer can make us allocate")
struct AnswerBoundsTests {
    static func members(_ count: Int) -> String {
        "{" + (0..<count).map { _ in #""id_token":"""# }.joined(separator: ",") + #","access_token":"A"}"#
    }

    @Test func redactStopsAtItsBoundOfSecrets() {
        let keys: Set<String> = ["id_token", "access_token"]
        let within = Array(Self.members(9).utf8)  // 10 secrets with the access token
        let over = Array(Self.members(10).utf8)  // 11
        #expect(within.withUnsafeBytes { SecretJSON.redact($0, keys: keys, maximumSecrets: 10) }?.secrets.count == 10)
        #expect(over.withUnsafeBytes { SecretJSON.redact($0, keys: keys, maximumSecrets: 10) } == nil)
        // Our own documents (the store) are not bounded by default.
        #expect(over.withUnsafeBytes { SecretJSON.redact($0, keys: keys) }?.secrets.count == 11)
    }

    @Test func aTokenAnswerHoldsAtMostItsBoundOfSecrets() throws {
        let fine = HTTPAnswer(status: 200, retryAfter: nil, body: Data(Self.members(HTTPAnswer.maximumSecrets - 1).utf8), redactions: [])
        #expect(try TokenResponse.grant(from: fine, defaultLifetime: .seconds(60)).get().accessToken == Secret("A"))
        let many = HTTPAnswer(status: 200, retryAfter: nil, body: Data(Self.members(HTTPAnswer.maximumSecrets).utf8), redactions: [])
        guard case .failure(let error) = TokenResponse.grant(from: many, defaultLifetime: .seconds(60)) else {
            Issue.record("an answer of \(HTTPAnswer.maximumSecrets + 1) secrets was read")
            return
        }
        #expect(error.kind == .transient)
    }

    /// The reproduction: a megabyte of empty id_tokens. The peak RSS (VmHWM, reset first
    /// through /proc/self/clear_refs) grows by far less than the 316 MB it did.
    @Test func aMegabyteOfEmptySecretsStaysSmall() throws {
        let body = Data(Self.members((1 << 20) / 14).utf8)
        let answer = HTTPAnswer(status: 200, retryAfter: nil, body: body, redactions: [])
        let reset = FileManager.default.isWritableFile(atPath: "/proc/self/clear_refs")
            && (try? "5".write(toFile: "/proc/self/clear_refs", atomically: false, encoding: .utf8)) != nil
        let before = Self.kilobytes("VmHWM")
        let outcome = TokenResponse.grant(from: answer, defaultLifetime: .seconds(60))
        let after = Self.kilobytes("VmHWM")
        guard case .failure = outcome else {
            Issue.record("the answer was read")
            return
        }
        if reset, let before, let after {
            #expect(after - before < 96 * 1024, "peak RSS grew by \(after - before) kB")
        }
    }

    static func kilobytes(_ field: String) -> Int? {
        guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return nil }
        for line in status.split(separator: "\n") where line.hasPrefix(field + ":") {
            return Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "")
        }
        return nil
    }
}
