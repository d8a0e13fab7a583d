import LoopFlow
import SessionCore
import Synchronization
import Testing

// The authority of docs/session.md and the SessionCore DocC article "Getting started", as
// written there (a test keeps it compiling and doing what the text says).
struct MyAuthority: AsyncSessionAuthority {
    func refresh(_ request: RefreshRequest) async throws -> TokenGrant {
        // POST request.refreshToken to your server, then:
        TokenGrant(accessToken: Secret("new access"), refreshToken: Secret("new refresh"),
                   expiresIn: .seconds(3600))
    }
}

@Suite("The getting-started example of the docs")
struct GettingStartedTests {
    @Test func anExpiredTokenIsRefreshedThroughTheAuthorityThenTheLogoutEndsIt() async throws {
        let loop = try EventLoop(name: "app")
        let session = try SessionManager(loop: loop, authority: AsyncAuthority(MyAuthority()))
        let states = Mutex<[SessionState]>([])
        let subscription = try session.subscribeToSessionState(onState: { state in states.withLock { $0.append(state) } })

        // Expired already: the first token request refreshes it (through MyAuthority).
        try await session.signIn(SessionTokens(accessToken: Secret("access"), refreshToken: Secret("refresh"),
                                               expiresIn: .zero, memberID: "m-42"))
        let token = try await session.freshAccessToken()
        #expect(token == Secret("new access"))  // MyAuthority's answer
        try await session.logout()
        #expect(!session.isLoggedIn())
        subscription.close()
        _ = try loop.shutdown()
        #expect(states.withLock { $0 }.contains(.loggedIn))
    }
}
