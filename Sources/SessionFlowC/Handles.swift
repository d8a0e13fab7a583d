import LoopFlow
import Synchronization

/// What a handle is a handle to: its low bits.
enum HandleKind: UInt64, Sendable {
    case runtime = 1
    case refreshRequest = 2
    case signIn = 3
    case subscription = 4

    static let bits: UInt64 = 3
    static let mask: UInt64 = (1 << bits) - 1
}

/// The one counter every handle's number comes from, whatever its kind.
private let nextHandleNumber = Atomic<UInt64>(1)

/// A process-wide table of handles. C hosts hold numbers (runtimes and refresh requests
/// as numbers dressed as pointers), never addresses of Swift objects: a stale, forged or
/// twice-used handle finds nothing and yields SF_ECLOSED instead of touching freed
/// memory. A handle is `number << 3 | kind`, the number from one process-wide counter: no
/// two handles of any kinds are equal, numbers are never reused within a process, and a
/// handle of one kind given where another is expected is told apart (`isOwnKind`), never
/// taken for an object of this table.
final class HandleTable<Object: Sendable>: Sendable {
    let kind: HandleKind
    private let table = LockedBox([UInt64: Object]())

    init(_ kind: HandleKind) {
        self.kind = kind
    }

    private func newHandle() -> UInt64 {
        nextHandleNumber.wrappingAdd(1, ordering: .relaxed).oldValue << HandleKind.bits | kind.rawValue
    }

    /// Whether `id` is a handle of this table's kind (a handle of another kind, or a number
    /// no table made, is not).
    func isOwnKind(_ id: UInt64) -> Bool {
        id & HandleKind.mask == kind.rawValue && id >> HandleKind.bits != 0
    }

    /// Stores `object` under a new handle.
    func insert(_ object: Object) -> UInt64 {
        let id = newHandle()
        table.withLockedValue { $0[id] = object }
        return id
    }

    /// Stores the object `make` builds for a new handle (an object that knows its handle).
    func insert(making make: (UInt64) -> Object) -> Object {
        let id = newHandle()
        let object = make(id)
        table.withLockedValue { $0[id] = object }
        return object
    }

    func lookup(_ id: UInt64) -> Object? {
        guard isOwnKind(id) else { return nil }
        return table.withLockedValue { $0[id] }
    }

    /// Takes the object out; only one caller ever gets it.
    func remove(_ id: UInt64) -> Object? {
        guard isOwnKind(id) else { return nil }
        return table.withLockedValue { $0.removeValue(forKey: id) }
    }

    /// Takes out every object matching `predicate`.
    func removeAll(where predicate: (Object) -> Bool) -> [Object] {
        table.withLockedValue { table in
            let matching = table.filter { predicate($0.value) }
            for id in matching.keys { table.removeValue(forKey: id) }
            return Array(matching.values)
        }
    }
}

/// The exact sizes a host may declare for a struct it passes in: those of released versions
/// of the header (each the struct's size when that version's last field group was added).
/// Any other size — one ending inside a field, or larger than the library knows — is
/// refused with SF_EINVAL: copying up to it would tear a field in two.
func acceptedSize(_ declared: Int, _ sizes: [Int]) -> Bool {
    sizes.contains(declared)
}

/// A handle number as the opaque pointer C sees, and back.
func pointer(for id: UInt64) -> OpaquePointer {
    OpaquePointer(bitPattern: UInt(id))!
}

func handle(of pointer: OpaquePointer?) -> UInt64? {
    guard let pointer else { return nil }
    return UInt64(UInt(bitPattern: pointer))
}

/// A C `void *` carried across threads. The host promised to make its userdata usable
/// from the loop thread; the library only hands it back.
struct UserData: @unchecked Sendable {
    let pointer: UnsafeMutableRawPointer?
}
