// What a server's error text costs to make safe (issue 29, point 9): `ErrorText.description`
// runs on the loop thread for every error answer, so its worst case is a loop stall.
import CBaseline
import SessionCore
@_spi(Fuzzing) import SessionOAuth

/// The worst description the matcher knows of: the whole input bound (4 KiB) of near misses
/// of a long secret (a 1 000-character refresh token, ordinary for JWT-shaped tokens, ending
/// in the one character the text lacks). Floor: the same text described with no secret (read,
/// filtered and cut: the work every description does), measured in the same run.
func errorTextRows(repetitions: Int) -> [Row] {
    let secret = Secret(String(repeating: "a", count: 1000) + "b")
    let text = String(repeating: "a", count: ErrorText.maximumDescriptionInput)
    func microseconds(_ secrets: [Secret]) -> Double {
        var best = Double.infinity
        for _ in 0..<3 {
            let start = bl_now_ns()
            for _ in 0..<repetitions { _ = ErrorText.description(text, secrets: secrets) }
            best = min(best, Double(bl_now_ns() - start) / Double(repetitions) / 1000)
        }
        return best
    }
    let floor = microseconds([])
    return [Row(
        name: "error description, 4 KiB of near misses of a 1 001-character secret", ours: microseconds([secret]),
        floor: floor, unit: "µs", baseline: "the same text, no secret")]
}
