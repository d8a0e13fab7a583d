import Crypto
import Foundation
import LoopFlow
import SessionCore
import SessionFlowTestSupport
import Testing

@_spi(Fuzzing) @testable import SessionFileStore

#if canImport(Glibc)
import Glibc
#endif

/// What the crash campaign saw, for its summary line.
struct CrashTally: Sendable, CustomStringConvertible {
    var kills = 0
    var killedAtSpawn = 0
    var keptHistory = 0
    var freshDirectory = 0
    /// The kill landed mid-write: the spare was left half-written (it does not decode), or
    /// a temporary file was left (between its creation and the rename).
    var midWrite = 0
    /// The store held generation n + 1: the write had finished, its "wrote" line had not come.
    var finishedUnreported = 0
    /// A temporary key file was left behind: the kill landed in the first key's creation.
    var midKeyCreation = 0
    /// The key existed, the store file not yet: the kill landed between key and first session.
    var keyWithoutSession = 0
    var writesSeen = 0
    var orphanedTemporaryFiles = 0
    var seconds = 0.0
    /// What went wrong (the campaign runs on a thread of its own; the test records these).
    var failures: [String] = []

    var description: String {
        "crash consistency: \(kills) SIGKILLs in \(String(format: "%.1f", seconds)) s "
            + "(\(keptHistory) on one store keeping its history, \(freshDirectory) on fresh directories; "
            + "\(killedAtSpawn) right at spawn); \(writesSeen) writes reported; "
            + "\(midWrite) landed mid-write (a half-written spare or a temporary file left), \(finishedUnreported) after the rename "
            + "before the report, \(midKeyCreation) mid-key-creation, \(keyWithoutSession) between key and first "
            + "session; \(orphanedTemporaryFiles) orphaned temporary files left in the directories; "
            + "never damaged, never lost"
    }
}

@Suite("Crash consistency")
struct CrashConsistencyTests {
    /// Kills on the store that keeps its history (one directory for all of them).
    static let historyKills = 400
    /// Kills on fresh directories, aimed at the first write and the key's creation.
    static let freshKills = 60

    /// The time limit is a hang guard only (~10× the 15–17 s the campaign takes here): how
    /// long it takes is printed, not judged (a loaded CI machine runs it 2–3× slower).
    @Test(.timeLimit(.minutes(3)))
    func aWriterKilledAtRandomMomentsLeavesTheOldOrTheNewSessionNeverDamagedNeverLost() async throws {
        let tally = try await onOwnThread { try Self.campaign() }
        print(tally)
        for failure in tally.failures { Issue.record(Comment(rawValue: failure)) }
        #expect(tally.kills >= 200)
    }

    private static func campaign() throws -> CrashTally {
        let probe = try sessionProbeExecutable()
        let tmp = TemporaryDirectory()
        var tally = CrashTally()
        let started = ContinuousClock.now

        // 1. One store, one directory: each writer continues the generations of the last.
        let directory = tmp.store
        var held = 0  // the generation the store holds (0: nothing written yet)
        var spareBefore: [UInt8] = []
        for round in 0..<historyKills {
            let before = Set(tmp.files(in: directory))
            let child = try ChildProcess(probe, ["--write-loop", directory, String(held)])
            if round % 10 == 0 {
                tally.killedAtSpawn += 1  // before it ran anything of its own
            } else {
                guard child.waitForLine(where: { $0 == "ready" }) != nil else {
                    tally.failures.append("the writer never became ready: \(child.readToEnd())")
                    return tally
                }
                usleep(UInt32.random(in: 0...40_000))
            }
            child.kill()
            child.waitForExit()
            tally.kills += 1
            tally.keptHistory += 1
            let lines = child.readToEnd()
            if let error = lines.first(where: { $0.hasPrefix("ERROR") || $0.hasPrefix("Fatal") }) {
                tally.failures.append("the writer failed: \(error)")
                return tally
            }
            let reported = lines.compactMap { $0.hasPrefix("wrote ") ? Int($0.dropFirst(6)) : nil }
            tally.writesSeen += reported.count
            let last = reported.last ?? held
            guard let generation = checkRead(directory, last: last, round: round, &tally.failures) else { return tally }
            if generation == last + 1 { tally.finishedUnreported += 1 }
            held = generation
            let left = Set(tmp.files(in: directory)).subtracting(before).filter { $0.contains(".tmp-") }
            // A half-written spare counts once: in the round whose kill left it.
            let spare = contents(directory + "/session.sfstore.spare")
            if !left.isEmpty || (spare != spareBefore && halfWritten(spare, key: directory + "/session.sfstore.key")) {
                tally.midWrite += 1
            }
            spareBefore = spare
            guard checkNothingDamaged(tmp, directory, &tally.failures) else { return tally }
        }
        // The store kept every account it was given (members m0, m1, m2 in turn), each at
        // the generation that last wrote it; private and encrypted at rest.
        let store = FileCredentialStore(directory: directory, key: .keyFile)
        if held >= 3 {
            if store.accounts() != ["m0", "m1", "m2"] { tally.failures.append("accounts lost: \(store.accounts())") }
            let key = SymmetricKey(data: contents(store.keyPath))
            let document = try FileCredentialStore.decode(contents(store.path), key: key)
            if document.active != "m\(held % 3)" { tally.failures.append("active account \(document.active ?? "nil")") }
            for (member, record) in document.accounts {
                let generation = record.session.accessToken.flatMap { Int($0.reveal().dropFirst(4)) } ?? -1
                if !(member == "m\(generation % 3)" && generation <= held && generation > held - 3) {
                    tally.failures.append("account \(member) holds generation \(generation), the store is at \(held)")
                }
            }
        }
        if mode(directory) != 0o700 || mode(store.path) != 0o600 || mode(store.keyPath) != 0o600 {
            tally.failures.append("modes: directory \(String(mode(directory), radix: 8)), file \(String(mode(store.path), radix: 8))")
        }
        let text = String(decoding: contents(store.path), as: UTF8.self)
        if text.contains("gen-\(held)") || text.contains("refresh-gen-") || text.contains("ext-") {
            tally.failures.append("the store file holds a token in plaintext")
        }
        tally.orphanedTemporaryFiles += tmp.files(in: directory).filter { $0.contains(".tmp-") }.count
        // The next write sweeps what killed writers left behind (their processes are gone) —
        // its own files only: another program's file that looks alike stays.
        let foreign = directory + "/notes.tmp-999999-1"
        _ = FileManager.default.createFile(atPath: foreign, contents: Data("not ours".utf8))
        try store.write(StoredSession(
            accessToken: Secret("gen-after"), refreshToken: Secret("refresh-gen-after"), memberID: "m0"))
        let leftovers = tmp.files(in: directory).filter { $0.contains(".tmp-") || $0.contains(".new-") }
        if leftovers != ["notes.tmp-999999-1"] {
            tally.failures.append("after a write, temporary files left: \(leftovers) (only the foreign one should be)")
        }

        // 2. Fresh directories: kills early in the first write, around the key's creation.
        for round in 0..<freshKills {
            let directory = tmp.path + "/fresh-\(round)"
            let child = try ChildProcess(probe, ["--write-loop", directory, "0"])
            if round % 8 == 0 {
                tally.killedAtSpawn += 1
            } else {
                guard child.waitForLine(where: { $0 == "ready" }) != nil else {
                    tally.failures.append("the writer never became ready: \(child.readToEnd())")
                    return tally
                }
                usleep(UInt32.random(in: 0...3_000))
            }
            child.kill()
            child.waitForExit()
            tally.kills += 1
            tally.freshDirectory += 1
            let lines = child.readToEnd()
            let reported = lines.compactMap { $0.hasPrefix("wrote ") ? Int($0.dropFirst(6)) : nil }
            tally.writesSeen += reported.count
            let files = tmp.files(in: directory)
            if files.contains(where: { $0.hasPrefix("session.sfstore.key.tmp-") || $0.hasPrefix("session.sfstore.key.new-") }) {
                tally.midKeyCreation += 1
            }
            if files.contains("session.sfstore.key") && !files.contains("session.sfstore") { tally.keyWithoutSession += 1 }
            if files.contains(where: { $0.hasPrefix("session.sfstore.tmp-") }) { tally.midWrite += 1 }
            tally.orphanedTemporaryFiles += files.filter { $0.contains(".tmp-") }.count
            guard let generation = checkRead(directory, last: reported.last ?? 0, round: round, &tally.failures) else { return tally }
            if generation == (reported.last ?? 0) + 1 { tally.finishedUnreported += 1 }
            guard checkNothingDamaged(tmp, directory, &tally.failures) else { return tally }
        }
        tally.seconds = Double((ContinuousClock.now - started).components.seconds)
            + Double((ContinuousClock.now - started).components.attoseconds) / 1e18
        return tally
    }

    /// Whether the spare's `bytes` do not decode (a write over it was cut short).
    private static func halfWritten(_ bytes: [UInt8], key: String) -> Bool {
        guard !bytes.isEmpty else { return false }
        return (try? FileCredentialStore.decode(bytes, key: SymmetricKey(data: contents(key)))) == nil
    }

    /// The store must answer the last reported generation or the one after it (0: absent);
    /// returns the generation it holds, nil after recording an issue.
    private static func checkRead(_ directory: String, last: Int, round: Int, _ failures: inout [String]) -> Int? {
        let read = FileCredentialStore(directory: directory, key: .keyFile).read()
        switch read {
        case .absent where last == 0:
            return 0
        case .present(let session):
            let access = session.accessToken?.reveal() ?? ""
            guard access.hasPrefix("gen-"), let generation = Int(access.dropFirst(4)) else {
                failures.append("round \(round): an access token that was never written")
                return nil
            }
            guard generation == last || generation == last + 1 else {
                failures.append("round \(round): the store holds generation \(generation), the writer reported \(last)")
                return nil
            }
            // One whole record, never a mix of two writes
            guard session.refreshToken?.reveal() == "refresh-gen-\(generation)", session.memberID == "m\(generation % 3)",
                session.externalUserID == "ext-\(generation)"
            else {
                failures.append("round \(round): generation \(generation) is not one whole record")
                return nil
            }
            return generation
        default:
            failures.append("round \(round): after a SIGKILL the store reads \(summary(of: read)) (last reported write: \(last))")
            return nil
        }
    }

    private static func checkNothingDamaged(_ tmp: TemporaryDirectory, _ directory: String, _ failures: inout [String]) -> Bool {
        let damaged = tmp.files(in: directory).filter { $0.contains(".damaged-") }
        if !damaged.isEmpty { failures.append("moved aside as damaged: \(damaged)") }
        return damaged.isEmpty
    }
}
