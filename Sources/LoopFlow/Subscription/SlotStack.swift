/// A stack of slots in memory of its own, for the loop thread's hot lists (`FlowCore`'s local
/// arrivals and spare records: a subscribe+close on the loop thread pushes and pops one of
/// each): no copy-on-write check per push and pop, as an `Array` stored in a class makes. Its
/// owner frees it (`deallocate`). Made on first push (a flow never subscribed to on its loop
/// thread allocates nothing); grows, never shrinks (like the arrays kept with their capacity
/// beside it).
struct SlotStack {
    private var base: UnsafeMutablePointer<Int32>?
    private var capacity = 0
    private(set) var count = 0

    func deallocate() { base?.deallocate() }

    @inline(__always) var isEmpty: Bool { count == 0 }

    @inline(__always) var last: Int32? { count == 0 ? nil : base.unsafelyUnwrapped[count - 1] }

    @inline(__always)
    mutating func push(_ slot: Int32) {
        if count == capacity { grow() }
        base.unsafelyUnwrapped[count] = slot
        count += 1
    }

    @inline(__always)
    mutating func pop() -> Int32? {
        guard count > 0 else { return nil }
        count -= 1
        return base.unsafelyUnwrapped[count]
    }

    /// The slots, oldest first, valid until the next change.
    @inline(__always)
    var elements: UnsafeBufferPointer<Int32> { UnsafeBufferPointer(start: base, count: count) }

    @inline(__always)
    mutating func removeAll() { count = 0 }

    private mutating func grow() {
        let larger = max(16, capacity * 2)
        let bigger = UnsafeMutablePointer<Int32>.allocate(capacity: larger)
        if let base {
            bigger.moveInitialize(from: base, count: count)
            base.deallocate()
        }
        base = bigger
        capacity = larger
    }
}
