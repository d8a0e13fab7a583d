// A refresh end to end (issue 32): request, parse, store write, event — against libcurl
// posting the same form to the same local token server in the same run.
import CBaseline
import FoundationEssentials
import LoopFlow
import SessionCore
import SessionFileStore
import SessionOAuth

/// The median of `runs` refreshes (`refreshNow()`, a file store with a key file: the answer's
/// tokens sealed and written) against a token endpoint on loopback that answers at once, and
/// the floor: libcurl's easy interface posting the same form to it (a connection each, as
/// ours) plus a durable write of a record's bytes (write + fsync + rename + directory fsync).
func refreshRows(runs: Int) async throws -> [Row] {
    guard let server = bl_token_server_start() else {
        return [Row(name: "refresh end to end", ours: .nan, floor: .nan, unit: "µs", note: "no local token server")]
    }
    defer { bl_token_server_stop(server) }
    let endpoint = "http://127.0.0.1:\(bl_token_server_port(server))/token"
    let directory = temporaryDirectory("sessionflow-bench-refresh")
    defer { removeTree(directory) }
    let loop = try EventLoop(name: "bench-refresh")
    let authority = try OAuthAuthority(OAuthConfiguration(tokenEndpoint: URL(string: endpoint)!, clientID: "bench"), loop: loop)
    let manager = try SessionManager(
        loop: loop, authority: authority, store: FileCredentialStore(directory: directory, key: .keyFile))
    try await manager.signIn(SessionTokens(
        accessToken: Secret("bench-access-0"), refreshToken: Secret("bench-refresh-0"), expiresIn: .seconds(3600)))
    // The same form ours sends (grant, refresh token, client id), to the same server;
    // interleaved with ours, so that machine noise hits both alike.
    let form = "grant_type=refresh_token&refresh_token=bench-refresh-0&client_id=bench"
    var ours: [Double] = [], floor: [Double] = []
    var curlFailed = false
    for _ in 0..<runs {
        let start = bl_now_ns()
        _ = try await manager.refreshNow()
        ours.append(Double(bl_now_ns() - start) / 1000)
        let curl = bl_curl_post_ns(endpoint, form, 1)
        let written = bl_now_ns()
        durableWrite(256, in: directory)
        if curl <= 0 { curlFailed = true }
        floor.append(curl / 1000 + Double(bl_now_ns() - written) / 1000)
    }
    await manager.close()
    try loop.shutdown()
    return [Row(
        name: "refresh end to end (request, parse, store write, event), local token server",
        ours: median(ours), floor: curlFailed ? .nan : median(floor), unit: "µs", target: .ratioAtMost(1.5),
        baseline: "libcurl POST + durable write", note: curlFailed ? "libcurl could not be loaded" : nil)]
}
