import ArgumentParser
import FoundationEssentials
import Glibc
import SessionCore

// The only commands that output a token: `token` (on standard output), `exec` (into the
// child's environment) and `credential` (to git, on standard output). Each gets it from
// `TokenSource`: refreshed through the shared store's lease when due.

/// `watch-session token`: a fresh access token and a newline, nothing else.
struct Token: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Prints a fresh access token (refreshed first when due) and a newline on standard output.",
        discussion: """
            For scripts: TOKEN=$(watch-session token). A refresh, when one is due (or when less \
            than --min-valid seconds are left), goes through the store's refresh lease, so any \
            number of processes asking at once cause one refresh at the server. On a terminal \
            the token is printed only with --show. Nothing but the token ever goes to standard \
            output; messages go to standard error.

            Exit codes (as status): 0 printed, 1 signed out (or no such account), 4 the session \
            expired, 7 the store cannot be read (or the refreshed tokens could not be stored: \
            nothing printed), 8 a due refresh failed, 64 bad usage, 71 watch-session could not \
            run (its event loop, too many open files), 74 the token could not be written to \
            standard output (closed, full).
            """)

    @OptionGroup var options: AccountOptions

    @Option(name: .customLong("min-valid"), help: "Refresh first when less than this many seconds are left.")
    var minValid: Int?

    @Flag(help: "Print the token on a terminal too (by default it is printed only into a pipe or a file).")
    var show = false

    @OptionGroup var verbosity: VerbosityOptions

    func validate() throws {
        if let minValid, minValid < 0 { throw ValidationError("--min-valid must be 0 or more, got \(minValid)") }
    }

    func run() async throws {
        if isatty(STDOUT_FILENO) == 1 && !show {
            throw CommandFailure(
                message: "standard output is a terminal: the token would be shown on screen (--show prints it anyway)",
                code: 64
            ).exit()
        }
        do {
            let (token, _) = try await TokenSource(
                view: try options.view(), account: options.account, logLevel: verbosity.level,
                minimumValidity: minValid.map { .seconds($0) }
            ).token()
            let failure = token.withUnsafeBytes { bytes in
                StandardStream.output.write(Data(bytes) + Data([0x0A]))
            }
            if let failure { throw Self.outputFailure(failure) }
        } catch let failure as CommandFailure {
            throw failure.exit()
        }
    }

    /// The token (or git's answer) did not all reach standard output: a script must not go on
    /// with a part of it, or with none.
    static func outputFailure(_ error: Int32) -> CommandFailure {
        CommandFailure(
            message: "the token could not be written to standard output: \(String(cString: strerror(error)))",
            code: StatusCodes.outputFailed)
    }
}

/// `watch-session exec -- CMD ARGS…`: CMD with a fresh token in its environment.
struct Exec: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Runs a command with a fresh access token in its environment (never in its arguments).",
        discussion: """
            watch-session exec -- curl -H @- …  or, with the token in $ACCESS_TOKEN: \
            watch-session exec -- sh -c 'curl -H "Authorization: Bearer $ACCESS_TOKEN" https://api.example.com/me'. \
            The command's exit status is passed through (128+N when a signal N ended it).

            Exit codes before the command runs (as status): 1 signed out, 4 the session expired, \
            7 the store cannot be read (or the refreshed tokens could not be stored: the command \
            is not run), 8 a due refresh failed, 64 bad usage, 71 watch-session could not run, \
            127 the command cannot be run.
            """)

    @OptionGroup var options: AccountOptions

    @Option(help: "The environment variable that carries the token.")
    var env = "ACCESS_TOKEN"

    @OptionGroup var verbosity: VerbosityOptions

    @Argument(parsing: .captureForPassthrough, help: "-- then the command and its arguments.")
    var command: [String] = []

    var argv: [String] { command.first == "--" ? Array(command.dropFirst()) : command }

    func validate() throws {
        if argv.isEmpty { throw ValidationError("no command given: watch-session exec [options] -- CMD ARGS…") }
        let valid = env.first.map { $0 == "_" || $0.isLetter } == true
            && env.allSatisfy { $0.isASCII && ($0 == "_" || $0.isLetter || $0.isNumber) }
        if !valid { throw ValidationError("--env is not a variable name: \(Terminal.escape(env))") }
    }

    func run() async throws {
        let token: Secret
        do {
            token = try await TokenSource(view: try options.view(), account: options.account, logLevel: verbosity.level)
                .token().token
        } catch let failure as CommandFailure {
            throw failure.exit()
        }
        let status = token.withUnsafeBytes { bytes in
            ChildProcess.run(argv, environment: ["\(env)=" + String(decoding: bytes, as: UTF8.self)])
        }
        switch status {
        case .exited(let code): throw ExitCode(code)
        case .signalled(let signal): throw ExitCode(128 + signal)
        case .notStarted(let why):
            throw CommandFailure(message: "cannot run \(Terminal.escape(argv[0])): \(why)", code: 127).exit()
        }
    }
}

/// `watch-session credential get|store|erase`: git's credential helper protocol
/// (`git help credential`, gitcredentials(7)), the token as the password.
struct Credential: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "A git credential helper: answers git with a fresh access token as the password.",
        discussion: """
            git config --global credential.https://git.example.com.helper \
            '!watch-session credential --account alice --host git.example.com'

            get: answers username and password (a fresh access token) for the host git asks \
            about. erase (git got a 401 with that token): the session compares and refreshes, \
            so the next get answers a new token. store: accepted and ignored (the session keeps \
            its tokens itself). Any other operation is ignored (exit 0, nothing printed), as \
            gitcredentials(7) asks of a helper.

            Only https requests are answered (plain http only for a loopback host: localhost, \
            127.0.0.1, [::1]); with --host, only requests for those hosts. Without --host, the \
            helper answers any host git asks it about: the git config key (credential.<url>.helper) \
            is then what keeps the token to one server. A request it does not answer gets \
            nothing (exit 0), and git goes on to its other helpers. Exit codes as token.
            """)

    @OptionGroup var options: AccountOptions

    @Option(help: "The username to answer (most servers ignore it for a bearer token).")
    var username = "oauth2"

    @Option(name: .customLong("host"), help: ArgumentHelp(
        "Answer only requests for this host (as git sends it: with its port when the URL names one). Repeatable.",
        valueName: "host"))
    var hosts: [String] = []

    @OptionGroup var verbosity: VerbosityOptions

    @Argument(help: "What git asks: get, store or erase (any other operation is ignored).")
    var operation: String

    func validate() throws {
        if hosts.contains(where: \.isEmpty) { throw ValidationError("--host is empty") }
    }

    func run() async throws {
        let request = Self.readRequest()
        // store: the session keeps its tokens itself; an operation git may add later: not ours.
        guard operation == "get" || operation == "erase" else { return }
        // A request for another server, or in the clear: nothing to say (git asks elsewhere).
        guard Self.answers(request, hosts: hosts) else { return }
        var source = TokenSource(view: try options.view(), account: options.account, logLevel: verbosity.level)
        if operation == "erase" {
            guard let password = request["password"] else { return }
            source.refused = Secret(password)
        }
        do {
            let (token, _) = try await source.token()
            guard operation == "get" else { return }
            var answer = Data("username=\(username)\npassword=".utf8)
            token.withUnsafeBytes { answer.append(contentsOf: $0) }
            answer.append(Data("\n".utf8))
            let failure = StandardStream.output.write(answer)
            answer.withUnsafeMutableBytes { bytes in _ = memset(bytes.baseAddress!, 0, bytes.count) }
            if let failure { throw Token.outputFailure(failure) }
        } catch let failure as CommandFailure {
            throw failure.exit()
        }
    }

    /// Whether the helper answers `request`: https (plain http only to a loopback host), and
    /// one of `hosts` when any are given (compared with git's `host` as it is, its port
    /// included, letter case aside).
    static func answers(_ request: [String: String], hosts: [String]) -> Bool {
        guard let host = request["host"], !host.isEmpty else { return false }
        switch request["protocol"]?.lowercased() {
        case "https": break
        case "http" where isLoopback(host): break
        default: return false
        }
        return hosts.isEmpty || hosts.contains { $0.lowercased() == host.lowercased() }
    }

    /// `localhost`, 127.0.0.0/8 or `[::1]`, with or without a port (git's `host` field).
    static func isLoopback(_ host: String) -> Bool {
        func isNumber(_ text: Substring) -> Bool { !text.isEmpty && text.allSatisfy { $0.isASCII && $0.isNumber } }
        if host.hasPrefix("[") {
            guard let close = host.firstIndex(of: "]") else { return false }
            let port = host[host.index(after: close)...]
            guard port.isEmpty || (port.first == ":" && isNumber(port.dropFirst())) else { return false }
            return host[host.index(after: host.startIndex)..<close] == "::1"
        }
        let parts = host.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count == 1 || (parts.count == 2 && isNumber(parts[1])) else { return false }
        if parts[0].lowercased() == "localhost" { return true }
        let octets = parts[0].split(separator: ".", omittingEmptySubsequences: false)
        return octets.count == 4 && octets[0] == "127" && octets.allSatisfy { isNumber($0) && $0.count <= 3 && Int($0)! <= 255 }
    }

    /// git's `key=value` lines, up to a blank line or the end of the input.
    static func readRequest() -> [String: String] {
        var fields: [String: String] = [:]
        while let line = readLine(strippingNewline: true), !line.isEmpty {
            guard let equals = line.firstIndex(of: "=") else { continue }
            fields[String(line[..<equals])] = String(line[line.index(after: equals)...])
        }
        return fields
    }
}
