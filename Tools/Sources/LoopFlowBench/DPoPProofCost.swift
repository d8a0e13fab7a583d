// What a DPoP proof costs (issue 31): one per token-endpoint request and one per authorized
// resource request. Ours: `DPoPKey.proof` with `ath` (claims built, the key loaded from secret
// memory into swift-crypto, ES256, base64url, the proof in a `Secret`). Floor: a bare
// swift-crypto P-256 signature of a message of the same size with a key made beforehand,
// measured in the same run.
import CBaseline
import Crypto
import SessionCore

func dpopProofRows(repetitions: Int) -> [Row] {
    let key = DPoPKey.generate()
    let token = Secret(String(repeating: "t", count: 64))
    let url = "https://api.example.com/v1/items?page=2"
    let bare = P256.Signing.PrivateKey()
    // The floor signs what a proof signs: a header and claims of the same size.
    let sample = (try? key.proof(method: "GET", url: url, accessToken: token).reveal()) ?? ""
    let message = Array(sample.split(separator: ".").prefix(2).joined(separator: ".").utf8)
    func microseconds(_ body: () -> Void) -> Double {
        var best = Double.infinity
        for _ in 0..<3 {
            let start = bl_now_ns()
            for _ in 0..<repetitions { body() }
            best = min(best, Double(bl_now_ns() - start) / Double(repetitions) / 1000)
        }
        return best
    }
    let floor = microseconds { _ = try? bare.signature(for: message) }
    let ours = microseconds { _ = try? key.proof(method: "GET", url: url, accessToken: token) }
    return [Row(
        name: "DPoP proof (ES256, with ath), µs per proof", ours: ours, floor: floor, unit: "µs",
        baseline: "bare swift-crypto P-256 signature")]
}
