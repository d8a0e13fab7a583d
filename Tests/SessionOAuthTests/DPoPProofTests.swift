import Foundation
import SessionCore
import SessionFlowTestSupport
import Testing

/// Issue 31: our DPoP proofs (RFC 9449 §4.2), checked by a JOSE library that is not ours
/// (joserfc, the one the test server uses), and the key's round trips.
@Suite("DPoP proofs")
struct DPoPProofTests {
    /// Runs `script` with python3 (joserfc imported), `input` on its stdin; its stdout.
    /// Runs `script` with `input` and returns what it printed, waiting on a thread of its own
    /// (`offThePool`): Python's start-up on a busy disk held a thread of the cooperative pool.
    private func python(_ script: String, input: String) async throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", "-c", script]
        let stdin = Pipe()
        let stdout = Pipe()
        process.standardInput = stdin
        process.standardOutput = stdout
        try process.run()
        stdin.fileHandleForWriting.write(Data(input.utf8))
        try stdin.fileHandleForWriting.close()
        let reading = stdout.fileHandleForReading
        let output = await offThePool { reading.readDataToEndOfFile() }
        await offThePool { process.waitUntilExit() }
        return String(decoding: output, as: UTF8.self)
    }

    /// Verifies each proof (one JSON object a line: proof, htm, htu, jkt, ath, nonce, iat) with
    /// joserfc, as RFC 9449 §4.3 says, and prints "verified N" or the first failure.
    private static let verifier = #"""
        import base64, hashlib, json, sys
        from joserfc import jws
        from joserfc.jwk import JWKRegistry
        count = 0
        for line in sys.stdin:
            case = json.loads(line)
            compact = jws.extract_compact(case["proof"].encode())
            header = compact.headers()
            assert header["typ"] == "dpop+jwt" and header["alg"] == "ES256", header
            assert set(header["jwk"]) == {"kty", "crv", "x", "y"}, header["jwk"]
            key = JWKRegistry.import_key(header["jwk"])
            claims = json.loads(jws.deserialize_compact(case["proof"], key, algorithms=["ES256"]).payload)
            assert key.thumbprint() == case["jkt"], (key.thumbprint(), case["jkt"])
            assert claims["htm"] == case["htm"] and claims["htu"] == case["htu"], claims
            assert claims["iat"] == case["iat"], claims
            if case["ath"] is None:
                assert "ath" not in claims, claims
            else:
                digest = hashlib.sha256(case["ath"].encode()).digest()
                assert claims["ath"] == base64.urlsafe_b64encode(digest).rstrip(b"=").decode(), claims
            assert claims.get("nonce") == case["nonce"], claims
            assert isinstance(claims["jti"], str) and len(claims["jti"]) >= 22, claims
            count += 1
        print("verified", count)
        """#

    @Test func joserfcVerifiesOurProofs() async throws {
        // Given proofs of two keys, with and without ath and nonce, for URLs with a query.
        let keys = [DPoPKey.generate(), DPoPKey.generate()]
        #expect(keys[0].thumbprint != keys[1].thumbprint)
        var lines: [String] = []
        for (index, key) in keys.enumerated() {
            for (token, nonce) in [(nil, nil), ("at-\(index)", nil), ("at-\(index)", "n-1_~x"), (nil, "nonce!")] as [(String?, String?)] {
                let url = "https://api.example.com/v1/items?page=2&q=\"x\"#frag"
                let proof = try key.proof(
                    method: "PATCH", url: url, accessToken: token.map { Secret($0) }, nonce: nonce, issuedAt: 1_700_000_000)
                let fields: [String: Any] = [
                    "proof": proof.reveal(), "htm": "PATCH", "htu": "https://api.example.com/v1/items",
                    "jkt": key.thumbprint, "ath": token as Any, "nonce": nonce as Any, "iat": 1_700_000_000,
                ]
                lines.append(String(decoding: try JSONSerialization.data(withJSONObject: fields), as: UTF8.self))
            }
        }
        // When joserfc checks them: then every one verifies.
        let output = try await python(Self.verifier, input: lines.joined(separator: "\n") + "\n")
        #expect(output.trimmingCharacters(in: .whitespacesAndNewlines) == "verified 8", "\(output)")
    }

    @Test func aKeyNeverSendsTheSameJTITwice() throws {
        let key = DPoPKey.generate()
        var seen = Set<String>()
        for _ in 0..<10_000 {
            let proof = try key.proof(method: "POST", url: "https://as.example.com/token")
            let claims = String(proof.reveal().split(separator: ".")[1])
            seen.insert(claims)  // the claims differ only by jti (same second or not: jti differs)
        }
        #expect(seen.count == 10_000)
    }

    @Test func theKeyRoundTripsThroughItsEncodedForm() throws {
        let key = DPoPKey.generate()
        let again = try DPoPKey(encodedPrivateKey: key.encodedPrivateKey)
        #expect(again == key && again.thumbprint == key.thumbprint && again.publicJWK == key.publicJWK)
        #expect(key.encodedPrivateKey.count == 43)
        #expect(throws: SessionError.self) { try DPoPKey(encodedPrivateKey: Secret("not base64url!")) }
        #expect(throws: SessionError.self) { try DPoPKey(privateKey: Secret(count: 32) { $0.initializeMemory(as: UInt8.self, repeating: 0) }) }
        #expect("\(key)".contains("<redacted>") && !"\(key)".contains(key.encodedPrivateKey.reveal()))
    }

    @Test func aNonceOutsideNQCHARIsRefused() {
        let key = DPoPKey.generate()
        for nonce in ["", "has space", "quote\"", "back\\slash", String(repeating: "n", count: 1025)] {
            #expect(throws: SessionError.self) { try key.proof(method: "GET", url: "https://x.example/", nonce: nonce) }
        }
    }
}
