import SessionCore

/// What a store instance knew of each of its records when it last saw it, so that a record
/// lost with a damaged store file that another reader moved aside is reported as damage, not
/// as a logout.
///
/// A damaged file is moved aside by whichever read or change meets it first: a session's own
/// read, another account's session, the pointer's writer, another process (a second session,
/// `watch-session status`). Only that reader learns of the damage. A running session that
/// reads its record afterwards finds none, which reads as another process's logout: it would
/// end, though it holds its tokens in memory and can write them back.
///
/// So each instance notes, when it sees a record (reads it present, or writes it), which
/// copies of damaged files (`<name>.damaged-*`) lie beside the store — listed before the read,
/// so that a copy made during it counts as new. A record found absent while a copy it did not
/// know of is there reads as damaged: the session reports it and writes itself back, as it does
/// when its own read meets the damage. No clock is compared: a copy is new by its name.
///
/// A logout is not damage: an account cleared while copies lie beside the store is kept in the
/// document's `cleared` (`StoreFormat.Document`), and its absence reads as absent whatever the
/// copies. The instance's own clear forgets the record; an absence that is no damage forgets it
/// too (the session follows it as a logout).
///
/// What it cannot tell apart, where a logout elsewhere reads as damage once (the session writes
/// itself back, and that logout has to be made again): a logout made while no copy lay beside
/// the store, followed by a damage before this instance read again; a second damage that lost
/// the first's `cleared` list; a plain `clear()` over damage by an instance that never read the
/// store (it cannot name the account); a writer of an older version, which drops `cleared`.
/// A listing that fails (no descriptor left) makes the read unavailable, tried again later.
struct RecordWitness {
    /// The plain calls (`read`, `write`, `clear`) act on the active record; a `SessionManager`'s
    /// sessions on their account's.
    enum Record: Hashable {
        case active
        case account(String)
    }

    struct Sighting {
        /// The account the record is filed under (for `.active`: the one active then).
        var account: String
        /// The copies of damaged files beside the store then.
        var copies: Set<String>
    }

    private var seen: [Record: Sighting] = [:]

    func sighting(_ record: Record) -> Sighting? { seen[record] }

    mutating func saw(_ record: Record, account: String, copies: Set<String>) {
        seen[record] = Sighting(account: account, copies: copies)
    }

    /// The record's absence is expected from now on (this instance cleared it, or it followed
    /// an absence that was no damage).
    mutating func forget(_ record: Record) {
        seen[record] = nil
    }
}

extension FileCredentialStore {
    /// The answer to a read that found `record` absent (the caller holds `lock`), in `document`
    /// (nil: no store file): damaged when a copy of a damaged file is beside the store that
    /// was not when this instance last saw the record, and the record was not logged out
    /// (`Document.cleared`).
    func absent(_ record: RecordWitness.Record, in directory: TrustedDirectory, document: Document?) -> StoreRead {
        guard let sighting = witness.sighting(record) else { return .absent }
        guard let copies = FileIO.damagedCopies(of: name, in: directory) else { return unlisted(directory) }
        let new = copies.subtracting(sighting.copies)
        guard let newest = new.max(), document?.cleared.contains(sighting.account) != true else {
            witness.forget(record)
            return .absent
        }
        // Once per damage: the copies now count as known.
        witness.saw(record, account: sighting.account, copies: copies)
        let whose = if case .account(let key) = record { "the record of account \"\(key)\"" } else { "the active session's record" }
        return .damaged(StoreError(
            "\(whose) is gone: the store file was damaged and another reader moved it aside to "
                + "\(directory.display(newest)) since this session last read it"))
    }

    /// A read whose directory could not be listed for copies (no descriptor left): tried
    /// again later, never taken for an absence.
    func unlisted(_ directory: TrustedDirectory) -> StoreRead {
        .unavailable(StoreError("cannot list \(self.directory) for copies of a damaged store file"))
    }

    /// Notes what a read saw of `record`, filed under `account`: `copiesBefore` were listed
    /// before it began (the caller holds `lock`).
    func witness(_ record: RecordWitness.Record, account: String?, _ read: StoreRead, copiesBefore: Set<String>, in directory: TrustedDirectory) {
        switch read {
        case .present:
            if let account { witness.saw(record, account: account, copies: copiesBefore) }
        case .damaged:
            // This reader was told, and its own read moved the file aside: known now.
            if let sighting = witness.sighting(record), let copies = FileIO.damagedCopies(of: name, in: directory) {
                witness.saw(record, account: sighting.account, copies: copies)
            }
        case .absent, .unavailable:
            break
        }
    }
}
