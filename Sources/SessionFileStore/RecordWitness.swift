import SessionCore

/// When a store instance last saw each of its records, so that a record lost with a damaged
/// store file that another reader moved aside is reported as damage, not as a logout.
///
/// A damaged file is moved aside by whichever read or change meets it first: a session's own
/// read, another account's session, the pointer's writer, another process (a second session,
/// `watch-session status`). Only that reader learns of the damage. A running session that
/// reads its record afterwards finds none, which reads as another process's logout: it would
/// end, though it holds its tokens in memory and can write them back. So a record found absent
/// while a damaged copy was moved aside since this instance last saw it (read it present, or
/// wrote it) reads as damaged: the session reports it and writes itself back, as it does when
/// its own read meets the damage. Once per damage: the answer counts as seeing the record.
///
/// What it cannot tell apart: another process that wrote the record back after the damage and
/// then logged it out, both before this instance read again. The session here writes it back
/// (it took the absence for the damage), and that logout has to be made again.
struct RecordWitness {
    /// The plain calls (`read`, `write`, `clear`) act on the active record; a `SessionManager`'s
    /// sessions on their account's.
    enum Record: Hashable {
        case active
        case account(String)
    }

    /// `CLOCK_REALTIME` nanoseconds (the clock of a damaged copy's name) when each record was
    /// last seen, taken before the read or change that saw it began.
    private var seen: [Record: Int64] = [:]

    func lastSeen(_ record: Record) -> Int64? { seen[record] }

    mutating func saw(_ record: Record, at time: Int64) {
        seen[record] = max(seen[record] ?? time, time)
    }

    /// The record was cleared by this instance (a logout): its absence is expected.
    mutating func forget(_ record: Record) {
        seen[record] = nil
    }
}

extension FileCredentialStore {
    /// The answer to a read that found `record` absent (the caller holds `lock`): damaged when a
    /// damaged copy of the store file was moved aside since this instance last saw the record.
    func absent(_ record: RecordWitness.Record, in directory: TrustedDirectory) -> StoreRead {
        guard let seen = witness.lastSeen(record) else { return .absent }
        let newest = FileIO.damagedCopies(of: name, in: directory).filter { $0.movedAt > seen }.max { $0.movedAt < $1.movedAt }
        guard let newest else { return .absent }
        witness.saw(record, at: max(newest.movedAt, FileIO.realTimeNow()))
        let whose = if case .account(let key) = record { "the record of account \"\(key)\"" } else { "the active session's record" }
        return .damaged(StoreError(
            "\(whose) is gone: the store file was damaged and another reader moved it aside to "
                + "\(directory.display(newest.name)) since this session last read it"))
    }

    /// Notes what a read or change that began at `startedAt` saw of `record` (under `lock`).
    func witness(_ record: RecordWitness.Record, _ read: StoreRead, startedAt: Int64) {
        switch read {
        case .present: witness.saw(record, at: startedAt)
        case .damaged: witness.saw(record, at: FileIO.realTimeNow())  // this reader was told
        case .absent, .unavailable: break
        }
    }
}
