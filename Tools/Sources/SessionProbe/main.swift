// A second process for the multi-process tests: opens a shared file store, asks for a
// fresh access token through the OAuth 2.0 authority, and prints a digest of it (never
// the token), the state, and what it saw.
//
//   session-probe STORE_DIR TOKEN_ENDPOINT CLIENT_ID
//
// Two more modes for the store's reliability tests (Tests/SessionFileStoreTests):
//
//   session-probe --write-loop STORE_DIR [START]
//       Writes sessions forever: generation START+1, START+2, ... (access token "gen-<n>",
//       refresh token "refresh-gen-<n>", member "m<n % 3>"), printing "ready" before the
//       first write and "wrote <n>" after each write returns. The crash test SIGKILLs it.
//
//   session-probe --session STORE_DIR [--as-nobody] [--logout] [--sign-in MEMBER ACCESS REFRESH] [--replace]
//       Runs a SessionManager on the file store (an authority that is offline), prints
//       "UID <uid>", "STATE <state>", each event as "EVENT <event>" (events carry no token),
//       logs out and/or signs in if asked (in that order), then "STATE <state>" and
//       "READ <what the store answers>". A sign-in refused because the store cannot be read
//       prints "SIGN-IN refused <error>"; --replace signs in replacing such a store.
//       --as-nobody drops to uid/gid 65534 before touching the store (root ignores
//       permission bits, so a root test runs the store operation here as nobody).
//
//   session-probe --rotate-loop STORE_DIR
//       Keeps two accounts and logs out forever (a key file store): round n writes "keep"
//       (access "keep-<n>") and "gone" (access "gone-<n>", active), then clears — a logout,
//       which rotates the key. Prints "ready", then "rotated <n>" after each logout returns.
//       The crash test SIGKILLs it mid-rotation: the store must always open.
//
//   session-probe --crash-holding TOKEN
//       Holds TOKEN in a Secret, prints "holding N bytes", then traps (the crash-report test).
//
//   session-probe --keyring STORE_DIR
//       Run inside `dbus-run-session` with an unlocked gnome-keyring-daemon: a store with the
//       default key source (.automatic) must keep its key in the Secret Service, not in a
//       file; logout must rotate it there. Prints "CHECK <what> ok" or "FAIL <what>: ..." per
//       property and "DONE"; exit 1 on a failure. Last it locks the keyring (the store must
//       be unavailable, not damaged). Leaves alice's session in STORE_DIR (a Secret Service
//       store) for the test to open without the bus.
//
//   session-probe --lease STORE_DIR SECONDS
//       Takes the store's refresh lease for SECONDS (trying every 10 ms for up to 20 s;
//       "BUSY <holder>" and exit 1 if it never gets it), prints "LEASE <pid>", then follows
//       commands on stdin, one a line, each answered by a line:
//         store MEMBER ACCESS REFRESH   writes that session (expiring in an hour): "STORED"
//         release                       releases the lease: "RELEASED"
//         exit                          exits (the lease is not released)
//       At the end of its input it exits without releasing. The lease tests stop it
//       (SIGSTOP) or kill it while it holds the lease.
import Crypto
import Foundation
import LoopFlow
import SessionCore
@_spi(Fuzzing) import SessionFileStore
import SessionOAuth

/// One line on stdout, written at once (no buffering: a SIGKILL must not lose it).
func say(_ line: String) {
    let bytes = Array((line + "\n").utf8)
    var written = 0
    while written < bytes.count {
        let count = bytes.withUnsafeBytes { write(1, $0.baseAddress! + written, $0.count - written) }
        if count < 0 {
            if errno == EINTR { continue }
            exit(4)
        }
        written += count
    }
}

func writeLoop(directory: String, start: Int) -> Never {
    let store = FileCredentialStore(directory: directory, key: .keyFile)
    say("ready")
    var n = start
    while true {
        n += 1
        do {
            try store.write(StoredSession(
                accessToken: Secret("gen-\(n)"), refreshToken: Secret("refresh-gen-\(n)"),
                accessTokenExpiresAt: .seconds(1_900_000_000), memberID: "m\(n % 3)", externalUserID: "ext-\(n)"))
        } catch {
            say("ERROR \(error.message)")
            exit(1)
        }
        say("wrote \(n)")
    }
}

func rotateLoop(directory: String) -> Never {
    let store = FileCredentialStore(directory: directory, key: .keyFile)
    say("ready")
    var n = 0
    while true {
        n += 1
        do {
            try store.write(StoredSession(accessToken: Secret("keep-\(n)"), refreshToken: Secret("r-keep-\(n)"), memberID: "keep"))
            try store.write(StoredSession(accessToken: Secret("gone-\(n)"), refreshToken: Secret("r-gone-\(n)"), memberID: "gone"))
            try store.clear()
        } catch {
            say("ERROR \(error.message)")
            exit(1)
        }
        say("rotated \(n)")
    }
}

func keyringMode(directory: String) -> Int32 {
    var failed = false
    func check(_ what: String, _ ok: Bool, _ detail: @autoclosure () -> String = "") {
        if ok {
            say("CHECK \(what) ok")
        } else {
            failed = true
            say("FAIL \(what): \(detail())")
        }
    }
    func files() -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []).sorted()
    }
    func session(_ member: String) -> StoredSession {
        StoredSession(accessToken: Secret("access-\(member)"), refreshToken: Secret("refresh-\(member)"), memberID: member)
    }
    let path = directory + "/session.sfstore"
    do {
        let store = FileCredentialStore(directory: directory)
        try store.write(session("alice"))
        let bytes = [UInt8](FileManager.default.contents(atPath: path) ?? Data())
        check("automatic chose the Secret Service", StoreHeader(bytes)?.source == .secretService, "header \(bytes.prefix(9))")
        check("no key file", !files().contains("session.sfstore.key"), "\(files())")
        check("read back", store.read() == .present(session("alice")), describe(store.read()))
        check("read with .secretService", FileCredentialStore(directory: directory, key: .secretService).read() == .present(session("alice")))
        check("not with .keyFile", {
            if case .unavailable = FileCredentialStore(directory: directory, key: .keyFile).read() { return true }
            return false
        }())
        // Logout rotates the key in the Secret Service: a copy of the file taken before does not open.
        try store.write(session("bob"))
        let backup = [UInt8](FileManager.default.contents(atPath: path) ?? Data())
        try store.clear()
        check("logout", store.read() == .absent && store.accounts() == ["alice"], "\(store.accounts())")
        let after = [UInt8](FileManager.default.contents(atPath: path) ?? Data())
        check("new key id", StoreHeader(after)?.keyID != StoreHeader(backup)?.keyID)
        _ = FileManager.default.createFile(atPath: path, contents: Data(backup), attributes: [.posixPermissions: 0o600])
        let restored = store.read()
        check("the backup taken before logout does not open", {
            if case .damaged = restored { return true }
            return false
        }(), describe(restored))
        // The backup was moved aside; the store starts afresh with the current key.
        try store.write(session("alice"))
        check("a store again", FileCredentialStore(directory: directory).read() == .present(session("alice")))
        check("still no key file", !files().contains("session.sfstore.key"), "\(files())")
        // A locked keyring answers "no such item": the store is unavailable, not damaged.
        let lock = Process()
        lock.executableURL = URL(fileURLWithPath: "/usr/bin/dbus-send")
        lock.arguments = [
            "--session", "--print-reply", "--dest=org.freedesktop.secrets", "/org/freedesktop/secrets",
            "org.freedesktop.Secret.Service.Lock", "array:objpath:/org/freedesktop/secrets/collection/login",
        ]
        lock.standardOutput = FileHandle.nullDevice
        try lock.run()
        lock.waitUntilExit()
        let before = files()
        let locked = FileCredentialStore(directory: directory).read()
        check("a locked keyring leaves the store unavailable", {
            if case .unavailable(let error) = locked { return error.message.contains("keyring is locked") }
            return false
        }(), describe(locked))
        check("a locked keyring moves nothing aside", files() == before, "\(before) → \(files())")
    } catch {
        check("store calls", false, "\(error)")
    }
    say("DONE")
    return failed ? 1 : 0
}

/// An authority that is never reachable: the session mode only exercises the store.
struct OfflineAuthority: SessionAuthority {
    func refresh(_ request: RefreshRequest, completion: AuthorityCompletion<TokenGrant>) {
        completion.fail(.transient("offline"))
    }
}

func describe(_ read: StoreRead) -> String {
    switch read {
    case .present(let stored): "present \(stored.memberID ?? "nil")"
    case .absent: "absent"
    case .unavailable(let error): "unavailable \(error.message)"
    case .damaged(let error): "damaged \(error.message)"
    }
}

func sessionMode(_ options: [String]) async -> Int32 {
    guard let directory = options.first else { return 2 }
    var signIn: (member: String, access: String, refresh: String)?
    var logout = false
    var asNobody = false
    var replacing = false
    var rest = options.dropFirst()
    while let option = rest.popFirst() {
        switch option {
        case "--as-nobody": asNobody = true
        case "--logout": logout = true
        case "--replace": replacing = true
        case "--sign-in":
            guard rest.count >= 3 else { return 2 }
            let values = Array(rest.prefix(3))
            rest = rest.dropFirst(3)
            signIn = (values[0], values[1], values[2])
        default: return 2
        }
    }
    if asNobody {
        guard setgroups(0, nil) == 0, setgid(65534) == 0, setuid(65534) == 0 else {
            say("ERROR cannot drop to nobody: \(String(cString: strerror(errno)))")
            return 3
        }
    }
    say("UID \(getuid())")
    do {
        let loop = try EventLoop(name: "probe")
        let store = FileCredentialStore(directory: directory)
        var configuration = SessionConfiguration()
        configuration.storeRetryInterval = .milliseconds(100)
        let started = configuration
        // Made and subscribed in one loop job: the start events cannot run in between.
        let (manager, subscription) = try await loop.submit {
            let manager = try SessionManager(loop: loop, authority: OfflineAuthority(), store: store, configuration: started)
            let subscription = try manager.events.subscribe(onEvent: { event in say("EVENT \(event)") })
            return (manager, subscription)
        }
        // The first STATE is the store's answer (made on the loop, the manager reads it there).
        await manager.storeRead()
        say("STATE \(manager.state.value)")
        if logout { try await manager.logout() }
        if let signIn {
            do throws(SessionError) {
                try await manager.signIn(SessionTokens(
                    accessToken: Secret(signIn.access), refreshToken: Secret(signIn.refresh),
                    expiresIn: .seconds(3600), memberID: signIn.member), replacingUnreadableStore: replacing)
            } catch {
                guard error.code == .storeUnavailable else { throw error }
                say("SIGN-IN refused \(error)")
            }
        }
        // The store work landed and its answers (a storeError) were handled on the loop; one more
        // loop turn delivers the events they emitted (waited for, not paused for).
        await manager.storeWorkDone()
        try await loop.submit {}
        say("STATE \(manager.state.value)")
        say("READ \(describe(store.read()))")
        subscription.close()
        await manager.close()
        _ = try loop.shutdown()
        return 0
    } catch {
        say("ERROR \(error)")
        return 1
    }
}

func leaseMode(directory: String, seconds: Double) -> Int32 {
    let store = FileCredentialStore(directory: directory)
    var tries = 0
    while true {
        switch store.tryAcquireRefreshLease(for: .milliseconds(Int64(seconds * 1000))) {
        case .acquired:
            break
        case .busy(let holder):
            tries += 1
            guard tries < 2000 else {
                say("BUSY \(holder.map(\.description) ?? "unknown")")
                return 1
            }
            usleep(10_000)
            continue
        }
        break
    }
    say("LEASE \(getpid())")
    while let line = readLine() {
        let words = line.split(separator: " ").map(String.init)
        switch words.first {
        case "store" where words.count == 4:
            do {
                try store.write(StoredSession(
                    accessToken: Secret(words[2]), refreshToken: Secret(words[3]),
                    accessTokenExpiresAt: SessionConfiguration.realtime() + .seconds(3600), memberID: words[1]))
                say("STORED")
            } catch {
                say("ERROR \(error.message)")
            }
        case "release":
            store.releaseRefreshLease()
            say("RELEASED")
        case "exit":
            exit(0)
        default:
            say("ERROR unknown command")
        }
    }
    // The store's deinit would release the lease: end without it.
    exit(0)
}

/// `--crash-holding TOKEN`: holds TOKEN in a `Secret`, prints "holding", then crashes (a
/// trap): what a crash report shows of a process that handles tokens (docs/storage-and-oauth.md).
func crashHolding(_ token: String) -> Never {
    let secret = Secret(token)
    say("holding \(secret.count) bytes")
    secret.withUnsafeBytes { bytes in
        // Keep the bytes reachable from a live frame when the trap comes.
        withExtendedLifetime(bytes) { fatalError("session-probe: a crash on purpose") }
    }
}

let arguments = CommandLine.arguments
if arguments.count == 3, arguments[1] == "--crash-holding" {
    crashHolding(arguments[2])
}
if arguments.count == 4, arguments[1] == "--lease", let seconds = Double(arguments[3]) {
    exit(leaseMode(directory: arguments[2], seconds: seconds))
}
if arguments.count >= 3, arguments[1] == "--write-loop" {
    writeLoop(directory: arguments[2], start: arguments.count > 3 ? Int(arguments[3]) ?? 0 : 0)
}
if arguments.count == 3, arguments[1] == "--rotate-loop" {
    rotateLoop(directory: arguments[2])
}
if arguments.count == 3, arguments[1] == "--keyring" {
    exit(keyringMode(directory: arguments[2]))
}
if arguments.count >= 3, arguments[1] == "--session" {
    exit(await sessionMode(Array(arguments.dropFirst(2))))
}

guard arguments.count == 4 || arguments.count == 5, let endpoint = URL(string: arguments[2]) else {
    FileHandle.standardError.write(Data("""
        usage: session-probe STORE_DIR TOKEN_ENDPOINT CLIENT_ID [REFRESH_TIMEOUT_MS]
               session-probe --write-loop STORE_DIR [START]
               session-probe --session STORE_DIR [--as-nobody] [--logout] [--sign-in MEMBER ACCESS REFRESH] [--replace]
               session-probe --lease STORE_DIR SECONDS
               session-probe --rotate-loop STORE_DIR
               session-probe --keyring STORE_DIR

        """.utf8))
    exit(2)
}

// With REFRESH_TIMEOUT_MS: that refresh timeout, and transient failures are retried (the
// session's own backoff) for up to 60 s until a token comes or the session ends — what an
// app asking for a token again would do (the rotation race tests).
var configuration = SessionConfiguration()
let retrying = arguments.count == 5
if retrying, let milliseconds = Int64(arguments[4]) {
    configuration.policy.timeout = .milliseconds(milliseconds)
    configuration.policy.initialBackoff = .milliseconds(200)
}
let loop = try EventLoop(name: "probe")
let authority = try OAuthAuthority(OAuthConfiguration(tokenEndpoint: endpoint, clientID: arguments[3]), loop: loop)
let manager = try SessionManager(
    loop: loop, authority: authority, store: FileCredentialStore(directory: arguments[1]), configuration: configuration)
let deadline = ContinuousClock.now + .seconds(60)
while true {
    do {
        let token = try await manager.freshAccessToken()
        let digest = SHA256.hash(data: Data(token.reveal().utf8)).map { String(format: "%02x", $0) }.joined()
        print("TOKEN-SHA256 \(digest.prefix(16))")
        print("STATE \(manager.state.value)")
        break
    } catch {
        print("ERROR \(error)")
        guard retrying, error.code == .transient, ContinuousClock.now < deadline else {
            print("STATE \(manager.state.value)")
            break
        }
        try await Task.sleep(for: error.retryAfter ?? .milliseconds(200))
    }
}
await manager.close()
try loop.shutdown()
