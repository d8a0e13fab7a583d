import LoopFlow

#if canImport(Glibc)
import Glibc
#endif

/// The store's faults that tests inject (a disk that fails a write, a filesystem that cannot
/// exchange, a read paused while another process writes...), keyed by directory so that other
/// stores are unaffected. Debug builds only: a release build (what the packages ship) has
/// neither the tables nor the look-ups, and every `injected…` function below is a constant.
extension FileIO {
    #if DEBUG
    /// Writes of files under a directory fail with an errno (disk full where no small
    /// filesystem can be mounted).
    static let injectedWriteErrors = LockedBox<[String: Int32]>([:])

    /// The temporary files of a store in a directory get this suffix instead of
    /// `<pid>-<random>`, so that a test can plant something under that name.
    static let injectedTemporarySuffixes = LockedBox<[String: String]>([:])

    /// The exchange of a store file with its spare fails with this errno in a directory (a
    /// filesystem that cannot exchange, such as vfat or some FUSE mounts).
    static let injectedExchangeErrors = LockedBox<[String: Int32]>([:])

    /// Called with the file's name once a read in a directory has opened it and before it
    /// reads (another process's write landing in between).
    static let injectedPausesAfterOpen = LockedBox<[String: @Sendable (String) -> Void]>([:])

    /// The next N writes of files under a directory fail with EIO, then writes succeed again
    /// (a disk that fails once).
    static let injectedWriteFailuresLeft = LockedBox<[String: Int]>([:])

    /// The directory's fsync before a spare is written over fails with this errno.
    static let injectedDirectorySyncErrors = LockedBox<[String: Int32]>([:])

    /// -1 with `errno` set when a write fault is injected for `path`, else nil.
    static func injectedWriteError(_ path: String) -> Int? {
        let counted = injectedWriteFailuresLeft.withLockedValue { left -> Bool in
            guard let key = left.first(where: { path.hasPrefix($0.key + "/") && $0.value > 0 })?.key else { return false }
            left[key]! -= 1
            return true
        }
        if counted {
            errno = EIO
            return -1
        }
        let code = injectedWriteErrors.withLockedValue { faults in
            faults.first { path.hasPrefix($0.key + "/") }?.value
        }
        guard let code else { return nil }
        errno = code
        return -1
    }

    static func injectedTemporarySuffix(_ directory: TrustedDirectory) -> String? {
        injectedTemporarySuffixes.withLockedValue { $0[directory.path] }
    }

    static func injectedPauseAfterOpen(_ name: String, in directory: TrustedDirectory) {
        if let pause = injectedPausesAfterOpen.withLockedValue({ $0[directory.path] }) { pause(name) }
    }

    /// -1 with `errno` set when the directory's fsync is to fail, else nil.
    static func injectedDirectorySyncError(_ directory: TrustedDirectory) -> Int32? {
        guard let code = injectedDirectorySyncErrors.withLockedValue({ $0[directory.path] }) else { return nil }
        errno = code
        return -1
    }

    /// -1 with `errno` set when the exchange is to fail, else nil.
    static func injectedExchangeError(_ directory: TrustedDirectory) -> Int32? {
        guard let code = injectedExchangeErrors.withLockedValue({ $0[directory.path] }) else { return nil }
        errno = code
        return -1
    }
    #else
    @inline(__always) static func injectedWriteError(_ path: String) -> Int? { nil }
    @inline(__always) static func injectedTemporarySuffix(_ directory: TrustedDirectory) -> String? { nil }
    @inline(__always) static func injectedPauseAfterOpen(_ name: String, in directory: TrustedDirectory) {}
    @inline(__always) static func injectedDirectorySyncError(_ directory: TrustedDirectory) -> Int32? { nil }
    @inline(__always) static func injectedExchangeError(_ directory: TrustedDirectory) -> Int32? { nil }
    #endif
}
