import LoopFlow

/// A process-wide table of handles. C hosts hold numbers (runtimes and refresh requests
/// as numbers dressed as pointers), never addresses of Swift objects: a stale, forged or
/// twice-used handle finds nothing and yields SF_ECLOSED instead of touching freed
/// memory. Numbers are never reused within a process.
final class HandleTable<Object: Sendable>: Sendable {
    private struct Table {
        var next: UInt64 = 1
        var objects: [UInt64: Object] = [:]
    }

    private let table = LockedBox(Table())

    /// Stores `object` under a new number.
    func insert(_ object: Object) -> UInt64 {
        table.withLockedValue { table in
            let id = table.next
            table.next += 1
            table.objects[id] = object
            return id
        }
    }

    /// Stores the object `make` builds for a new number (an object that knows its handle).
    func insert(making make: (UInt64) -> Object) -> Object {
        table.withLockedValue { table in
            let id = table.next
            table.next += 1
            let object = make(id)
            table.objects[id] = object
            return object
        }
    }

    /// Stores `object` under `id` (a number already unique in the process).
    func insert(_ object: Object, as id: UInt64) {
        table.withLockedValue { $0.objects[id] = object }
    }

    func lookup(_ id: UInt64) -> Object? {
        table.withLockedValue { $0.objects[id] }
    }

    /// Takes the object out; only one caller ever gets it.
    func remove(_ id: UInt64) -> Object? {
        table.withLockedValue { $0.objects.removeValue(forKey: id) }
    }

    /// Takes out every object matching `predicate`.
    func removeAll(where predicate: (Object) -> Bool) -> [Object] {
        table.withLockedValue { table in
            let matching = table.objects.filter { predicate($0.value) }
            for id in matching.keys { table.objects.removeValue(forKey: id) }
            return Array(matching.values)
        }
    }
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
