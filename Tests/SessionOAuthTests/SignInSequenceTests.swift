import Foundation
import LoopFlow
import SessionCore
import SessionFlowTestSupport
import Testing

@testable import SessionOAuth

/// SignInSequence (issue 26, point 2): discovery, the flow and the sign-in as one sequence
/// with one cancel, against the real Authlib server; and its one error vocabulary.
@Suite("SignInSequence: discovery, the flow, the sign-in, one cancel", .serialized)
struct SignInSequenceTests {
    /// The server's device flow, its endpoints discovered from its issuer.
    static func sequence(_ server: OAuthServer, prompts: PromptLog) -> SignInSequence {
        SignInSequence(
            .issuer(SignInSequence.Issuer(server.base, clientID: "sessionflow-public")),
            method: .device { prompt in prompts.add(prompt) }, scope: "profile")
    }

    @Test func discoveryThenTheApprovedFlowSignsTheSessionIn() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        try await server.device(["interval": "1", "expires_in": "60"])
        let session = try await LiveSession(server)
        let prompts = PromptLog(loop: session.loop)
        let sequence = Self.sequence(server, prompts: prompts)
        let signIn = Task { try await sequence.signIn(session.manager) }
        let prompt = try #require(await prompts.first())
        #expect(prompts.allOnLoopThread)
        try await server.approve(prompt.userCode)
        try await signIn.value
        #expect(session.manager.state.value == .loggedIn && session.store.session != nil)
        #expect(try await server.stats()["metadata_requests"] == 1)
        #expect(try await server.deviceLog().deviceForms.first?["scope"] == "profile")
        await session.stop()
    }

    @Test func aCancelDuringDiscoveryEndsItAndNoFlowStarts() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        try await server.device(["interval": "1", "expires_in": "60"])
        let session = try await LiveSession(server)
        let prompts = PromptLog(loop: session.loop)
        try await server.fault("delay:30", endpoint: "metadata")  // the discovery is held: in flight
        let outcomes = LockedBox<[Result<Void, SessionError>]>([])
        let handle = Self.sequence(server, prompts: prompts).signIn(session.manager) { result in
            outcomes.withLockedValue { $0.append(result) }
        }
        #expect(await eventually(timeout: .seconds(10), every: .milliseconds(10)) {
            ((try? await server.stats())?["metadata_requests"] ?? 0) >= 1
        })
        let cancelledAt = ContinuousClock.now
        handle.cancel()
        handle.cancel()
        #expect(await eventually(timeout: .seconds(10), every: .milliseconds(10)) { outcomes.withLockedValue { !$0.isEmpty } })
        #expect(ContinuousClock.now - cancelledAt < .seconds(10))  // a hang guard: a third of the hold
        try await Task.sleep(for: .milliseconds(300))
        let seen = outcomes.withLockedValue { $0 }
        #expect(seen.count == 1)
        if case .failure(let error)? = seen.first { #expect(error.code == .cancelled) } else { Issue.record("not cancelled") }
        // No fallback to OpenID Connect, no device request, no prompt.
        #expect(try await server.stats()["openid_requests"] == 0)
        #expect(try await server.deviceStats()["device_requests"] == 0)
        #expect(await prompts.first(timeout: .milliseconds(10)) == nil)
        #expect(session.manager.state.value == .loggedOut)
        await session.stop()
    }

    @Test func aCancelDuringTheFlowEndsItAndSignsNothingIn() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        try await server.device(["interval": "1", "expires_in": "60"])
        let session = try await LiveSession(server)
        let prompts = PromptLog(loop: session.loop)
        let outcomes = LockedBox<[Result<Void, SessionError>]>([])
        let handle = Self.sequence(server, prompts: prompts).signIn(session.manager) { result in
            outcomes.withLockedValue { $0.append(result) }
        }
        let prompt = try #require(await prompts.first())
        handle.cancel()
        #expect(await eventually(timeout: .seconds(10), every: .milliseconds(10)) { outcomes.withLockedValue { !$0.isEmpty } })
        let polls = try await server.deviceLog().polls.count
        try await server.approve(prompt.userCode)
        try await Task.sleep(for: .milliseconds(2500))
        #expect(try await server.deviceLog().polls.count == polls)
        let seen = outcomes.withLockedValue { $0 }
        #expect(seen.count == 1)
        if case .failure(let error)? = seen.first { #expect(error.code == .cancelled) } else { Issue.record("not cancelled") }
        #expect(session.manager.state.value == .loggedOut && session.store.session == nil)
        await session.stop()
    }

    @Test func aConfigurationThatCannotServeTheFlowIsUnusableBeforeAnyRequest() async throws {
        let loop = try EventLoop(name: "sequence-unusable")
        defer { _ = try? loop.shutdown() }
        let configuration = OAuthConfiguration(tokenEndpoint: URL(string: "http://127.0.0.1:9/token")!, clientID: "c")
        let sequence = SignInSequence(.configured(configuration), method: .device { _ in })
        let failure = await #expect(throws: SignInSequence.Failure.self) { try await sequence.prepared(on: loop) }
        guard case .unusable(let error, let discovered)? = failure else {
            Issue.record("not unusable: \(String(describing: failure))")
            return
        }
        #expect(!discovered && error.field == "device authorization endpoint")
        #expect(failure?.sessionError == SessionError(.configuration, "the device_authorization_endpoint is not set"))
    }

    @Test func aDiscoveryWithoutAnAnswerIsTransientAndAnyOtherFailureIsConfiguration() {
        let issuer = URL(string: "https://auth.example.com")!
        let network = SignInSequence.Failure.discovery(OAuthDiscoveryError(.network, message: "timed out"), issuer: issuer)
        #expect(network.sessionError == SessionError(.transient, "discovery at https://auth.example.com: timed out"))
        let refused = SignInSequence.Failure.discovery(
            OAuthDiscoveryError(.metadata, field: "issuer", message: "differs"), issuer: issuer)
        #expect(refused.sessionError == SessionError(.configuration, "discovery at https://auth.example.com (issuer): differs"))
        let metadata = SignInSequence.Failure.unusable(
            OAuthConfigurationError(field: "authorization endpoint", reason: "is not set"), discovered: true)
        #expect(metadata.sessionError == SessionError(.configuration, "the issuer's metadata: the authorization_endpoint is not set"))
    }
}
