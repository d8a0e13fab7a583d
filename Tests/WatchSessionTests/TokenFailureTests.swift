import Foundation
import SessionCore
import SessionFileStore
import SessionFlowTestSupport
import Testing

/// `token`, `exec` and `credential` when something other than the session fails: the store
/// cannot take a refresh's tokens (docs/watch-session.md, the status table and "token, exec,
/// credential").
@Suite("watch-session token, exec, credential when something fails", .serialized)
struct TokenFailureTests {
    /// Another process holds the store's write lock longer than the store's patience while a
    /// `token` refreshes: the refresh is made (the server rotated the refresh token), but its
    /// tokens never reach the store. No token is printed, exit 7, standard error says why (no
    /// secret in it); the store still holds the old tokens — and, the refresh token having
    /// rotated, the next refresh is refused: the session expired (exit 4).
    @Test func aRefreshTheStoreCannotTakePrintsNoTokenAndExits7() async throws {
        let server = try await AuthServer()
        let (access, refresh) = try await server.passwordSignIn()
        let directory = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try storeSignedIn(directory, server: server, access: access, refresh: refresh, expiresIn: .seconds(600))
        // The lock is held by this process (flock is per open file: the CLI's own open conflicts)
        // until the CLI has exited.
        let lock = open(FileCredentialStore(directory: directory).writeLockPath, O_RDWR | O_CLOEXEC)
        #expect(lock >= 0 && flock(lock, LOCK_EX) == 0)
        let run = try await watchSession(["token", "--store", directory, "--min-valid", "1200"])
        close(lock)
        #expect(run.status == 7, "\(run)")
        #expect(run.stdout.isEmpty, "\(run)")
        #expect(run.stderr.contains("the refreshed tokens could not be stored"), "\(run)")
        #expect(try await server.stats()["refresh_grants"] == 1, "no refresh was made")
        #expect(storedAccessToken(directory) == access, "the store took the write after all")
        #expect(clean(run.stderr, of: [access, refresh]), "\(run)")
        // What the script had to learn: the stored refresh token is spent.
        let next = try await watchSession(["token", "--store", directory, "--min-valid", "1200"])
        #expect(next.status == 4 && next.stdout.isEmpty && next.stderr.contains("expired"), "\(next)")
    }

    /// The same lock, let go while the `token` process waits for it (once the server has the
    /// refresh): the write lands, the token is printed, exit 0 — the wait is for the store, not
    /// a failure at the first sight of a lock.
    @Test func aWriteLockLetGoInTimeLetsTheTokenOut() async throws {
        let server = try await AuthServer()
        let (access, refresh) = try await server.passwordSignIn()
        let directory = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try storeSignedIn(directory, server: server, access: access, refresh: refresh, expiresIn: .seconds(600))
        let lock = open(FileCredentialStore(directory: directory).writeLockPath, O_RDWR | O_CLOEXEC)
        #expect(lock >= 0 && flock(lock, LOCK_EX) == 0)
        let token = try Spawned(["token", "--store", directory, "--min-valid", "1200"])
        let refreshed = try await eventually { try await server.stats()["refresh_grants"] == 1 }
        close(lock)
        #expect(refreshed, "the refresh never reached the server")
        let run = await token.finish()
        #expect(run.status == 0, "\(run)")
        let fresh = try #require(storedAccessToken(directory))
        #expect(fresh != access && run.stdout == fresh + "\n", "\(run)")
        #expect(run.stderr.isEmpty, "\(run)")
    }
}
