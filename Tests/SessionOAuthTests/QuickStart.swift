import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking  // URLSession on Linux
#endif
import LoopFlow
import SessionCore
import SessionFileStore
import SessionOAuth

/// The README's Swift quick start: README.md shows the lines between the markers (the test
/// `theReadmeShowsThisCode` compares them), and `QuickStartTests` runs them against the real
/// Authlib server. `show` stands for the app's UI.
func quickStart(
    issuer: URL, clientID: String, storeDirectory: String, api: String, show: @escaping @Sendable (String) -> Void
)
    async throws
{
    // README begin
    let loop = try EventLoop(name: "app")  // the library's loop, on a thread of its own
    let oauth = try await OAuthDiscovery.configuration(issuer: issuer, clientID: clientID, loop: loop)
    let session = try SessionManager(
        loop: loop, authority: try OAuthAuthority(oauth, loop: loop),
        store: FileCredentialStore(directory: storeDirectory))  // encrypted; survives restarts
    let states = try session.subscribeToSessionState(onState: { state in show("session: \(state)") })
    await session.storeRead()  // a session stored by the last run is restored here
    if !session.isLoggedIn() {
        try await session.signIn(with: DeviceAuthorization(oauth) { prompt in
            show("Open \(prompt.verificationURI) and enter \(prompt.userCode)")
        })
    }
    // Call an API: authorized (the token refreshed first when it is due), retried once after a 401.
    let body: Data = try await session.perform(method: "GET", url: api) { authorization in
        var request = URLRequest(url: URL(string: api)!)
        for field in authorization.fields { request.setValue(field.value.reveal(), forHTTPHeaderField: field.name) }
        let (body, response) = try await URLSession.shared.data(for: request)
        let answer = response as! HTTPURLResponse
        if answer.statusCode == 401 {
            return .refused(status: 401, wwwAuthenticate: answer.value(forHTTPHeaderField: "WWW-Authenticate"))
        }
        return .done(body)
    }
    show("the API answered with \(body.count) bytes")
    try await session.logout()  // revoked at the server, store wiped, timers cancelled
    states.close()
    _ = try loop.shutdown()
    // README end
}
