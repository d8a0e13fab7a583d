// Over 400 lines (432): the record layout, its pages and the walk over them are one memory
// contract (offsets, strides, who writes what under which lock); a quarter is doc comments.
import CLibUV
import Synchronization

/// One subscriber's record in a flow's `SubscriberTable`: 24 bytes (a StateFlow's) or 32 (a
/// SharedFlow's, which keeps each subscriber's first sequence) of raw memory at an address
/// that never changes while the flow's core lives (handles point at it).
///
/// | offset | field | |
/// |---|---|---|
/// | 0 | `tag`, atomic | `id << 5 \| usual invoker (16) \| foreign (8) \| extras (4) \| registered (2) \| closed (1)`; 1 when free |
/// | 8, 16 | callback | a Swift subscriber's value closure (function, context; the context retained), or a C subscriber's function pointer and userdata |
/// | 24 | `cursor` | SharedFlow only: its first live sequence |
///
/// What most subscribers do not have lives in the record's *side record* (`SubscriberSide`,
/// 16 bytes in a parallel page made only when a record of that page first needs one): the
/// optional terminal and release callbacks (`extras`), and a C subscriber's `ForeignCallback`
/// (`foreign` set in the tag) unless it is its flow's *usual* one — the first a C subscriber
/// of the flow brought, which the table holds for the flow's life
/// (`SubscriberPages.usualInvoker`); then the tag has `usualInvoker` too and the walk reads
/// the invoker from the table. A walk streams the records and reads a side record only for a
/// record whose tag names it: at a million C subscribers it is memory-bound, and reads 24
/// bytes of a StateFlow's record and the host's userdata per subscriber.
///
/// The tag is the only field touched off the loop thread after admission without the lock: a
/// closer compares its id and sets `closed` with one compare-and-swap, so a handle whose record
/// was recycled for a newer subscription finds another id there and closes nothing. (An
/// off-loop close of a record no delivery has registered yet may then free it, under the lock:
/// `FlowCore.reclaimElsewhere`.) The other
/// fields (and the side record, and the `foreign`/`extras`/`usualInvoker` bits, which never
/// change while the record is held) are written under the flow's lock at admission (before the
/// loop may read them: the arrival reaches the loop through the same lock) — or, a StateFlow's
/// loop-thread admission into a spare record, on the loop thread — and afterwards only on
/// the loop thread.
struct SubscriberEntry: @unchecked Sendable {
    /// A StateFlow's record: tag and callback.
    static let valueStride = 24
    /// A SharedFlow's record: tag, callback and cursor.
    static let sequencedStride = 32
    static let closedBit: UInt64 = 1
    static let registeredBit: UInt64 = 2
    /// The record has a side record with a `SubscriberExtras`.
    static let extrasBit: UInt64 = 4
    /// A C subscriber: its callback words are a function pointer and userdata, and its
    /// `ForeignCallback` is in its side record — or, with `usualInvoker`, the table's.
    static let foreignBit: UInt64 = 8
    /// With `foreign`: the subscriber's `ForeignCallback` is the table's usual one (held by the
    /// table, not by the record), and its walk reads it there; no side record for it.
    static let usualInvokerBit: UInt64 = 16
    /// The id sits above the five flag bits (ids start at 1; 2^59 of them do not run out).
    static let idShift: UInt64 = 5
    /// The tag of a free record: closed, unregistered, no id.
    static let freeTag: UInt64 = closedBit

    let raw: UnsafeMutableRawPointer

    @inline(__always) init(_ raw: UnsafeMutableRawPointer) { self.raw = raw }

    @inline(__always)
    var tag: UnsafeMutablePointer<Atomic<UInt64>> { raw.assumingMemoryBound(to: Atomic<UInt64>.self) }

    /// The callback's two words (see the table above), from `callbackOffset`.
    static let callbackOffset = 8

    @inline(__always)
    var word0: UnsafeRawPointer? {
        get { raw.load(fromByteOffset: 8, as: UnsafeRawPointer?.self) }
        nonmutating set { raw.storeBytes(of: newValue, toByteOffset: 8, as: UnsafeRawPointer?.self) }
    }

    @inline(__always)
    var word1: UnsafeRawPointer? {
        get { raw.load(fromByteOffset: 16, as: UnsafeRawPointer?.self) }
        nonmutating set { raw.storeBytes(of: newValue, toByteOffset: 16, as: UnsafeRawPointer?.self) }
    }

    /// A SharedFlow's record only (a StateFlow's is 24 bytes: this is the next one's tag).
    @inline(__always)
    var cursor: UInt64 {
        get { raw.load(fromByteOffset: 24, as: UInt64.self) }
        nonmutating set { raw.storeBytes(of: newValue, toByteOffset: 24, as: UInt64.self) }
    }

    /// Loop thread, inside a walk: whether the next callback may run. A sequentially
    /// consistent load (a plain load on x86) pairs with the walk's store and the closer's
    /// read-modify-write, so a closer either sees the walk or the walk sees it closed.
    @inline(__always)
    var isOpen: Bool { tag.pointee.load(ordering: .sequentiallyConsistent) & Self.closedBit == 0 }

    /// Registered and open: a walk calls it.
    @inline(__always)
    var isLive: Bool { Self.isLive(tag.pointee.load(ordering: .sequentiallyConsistent)) }

    @inline(__always)
    static func isLive(_ tag: UInt64) -> Bool { tag & (closedBit | registeredBit) == registeredBit }

    /// The id of the subscription holding the record now (0 when free).
    var id: UInt64 { tag.pointee.load(ordering: .acquiring) >> Self.idShift }
}

/// A record's side record (see `SubscriberEntry`): 16 bytes, read only when the record's tag
/// has `foreign` or `extras`.
///
/// | offset | field |
/// |---|---|
/// | 0 | `foreign`: `Unmanaged<ForeignCallback<Value>>`, retained, for a C subscriber whose invoker is not its flow's usual one |
/// | 8 | `extras`: `Unmanaged<SubscriberExtras>`, retained |
struct SubscriberSide {
    static let stride = 16

    let raw: UnsafeMutableRawPointer

    @inline(__always) init(_ raw: UnsafeMutableRawPointer) { self.raw = raw }

    @inline(__always)
    var foreign: UnsafeRawPointer? {
        get { raw.load(fromByteOffset: 0, as: UnsafeRawPointer?.self) }
        nonmutating set { raw.storeBytes(of: newValue, toByteOffset: 0, as: UnsafeRawPointer?.self) }
    }

    @inline(__always)
    var extras: UnsafeRawPointer? {
        get { raw.load(fromByteOffset: 8, as: UnsafeRawPointer?.self) }
        nonmutating set { raw.storeBytes(of: newValue, toByteOffset: 8, as: UnsafeRawPointer?.self) }
    }
}

/// A live record as a walk hands it over: the record, its tag as the walk read it (the
/// `foreign`/`extras`/`usualInvoker` bits hold while it is live), and where its side record
/// is — the page's entry in the side directory, read only once the tag (an acquiring load,
/// after the admission's releasing store) says there is one.
struct WalkedEntry {
    let entry: SubscriberEntry
    let tag: UInt64
    let sidePage: UnsafeMutablePointer<UnsafeMutableRawPointer?>
    let index: Int

    /// Only when `tag` has `foreign` or `extras`.
    @inline(__always)
    var side: SubscriberSide { SubscriberSide(sidePage.pointee.unsafelyUnwrapped + index * SubscriberSide.stride) }

    @inline(__always) var isOpen: Bool { entry.isOpen }
    @inline(__always) var cursor: UInt64 { entry.cursor }
    var id: UInt64 { entry.id }
}

/// A flow's subscriber records, in pages that never move (page p holds 16·2^p records, so
/// 28 pages cover every `Int32` slot and the page directory has a fixed size), and their side
/// records in parallel pages made on first need. Immutable as a value (only the memory it
/// points to changes), so the loop thread reads it without the lock while other threads take
/// slots (`SlotPool`) under it.
///
/// A page's pointer (record or side) is written once, under the flow's lock, before any slot
/// on it is handed out (for a side page: before the record that needs it is published), and
/// never changes: the loop reads it for slots it was handed through the lock. So is the usual
/// invoker (before the first record that names it is published).
struct SubscriberPages: @unchecked Sendable {
    static let firstPageSlots = 16
    static let maxPages = 28
    static let prefetchDistance = 8
    /// The first page whose walk prefetches (its first slot is 1 008). Below it a walk's
    /// records and contexts stay in cache, and the check per record cost more than it saved:
    /// alternated, medians of 8 runs, fan-out at 100 subscribers 2.02× → 1.85× the floor (Swift),
    /// 10 000 2.05× → 1.82×, 1 M (prefetching) 3.90× → 3.27×.
    static let prefetchFromPage = 6

    /// Where the directory keeps the usual invoker, after the pages.
    static let usualInvokerIndex = 2 * maxPages

    /// `maxPages` record pages, then `maxPages` side pages, then the usual invoker's address
    /// (retained; nil until a C subscriber was admitted). That last word is accessed as an
    /// atomic (`usual`): a walk reads it on the loop thread, without the lock, while another
    /// thread's admission of the flow's first C subscriber may set it. (In the directory, not
    /// an allocation of its own: a word of its own made every C fan-out walk 12–16 % slower,
    /// alternated, medians of 8.)
    private let directory: UnsafeMutablePointer<UnsafeMutableRawPointer?>
    /// Bytes per record: `SubscriberEntry.valueStride` or `.sequencedStride`.
    let stride: Int

    init(stride: Int) {
        precondition(stride == SubscriberEntry.valueStride || stride == SubscriberEntry.sequencedStride)
        self.stride = stride
        directory = .allocate(capacity: Self.usualInvokerIndex + 1)
        directory.initialize(repeating: nil, count: Self.usualInvokerIndex + 1)
    }

    /// The usual invoker's word, as the atomic it is used as (same size and alignment as the
    /// optional pointer the directory holds there: nil is 0).
    @inline(__always)
    private func usual<T>(_ body: (UnsafeMutablePointer<Atomic<UInt>>) -> T) -> T {
        (directory + Self.usualInvokerIndex).withMemoryRebound(to: Atomic<UInt>.self, capacity: 1, body)
    }

    /// Frees the pages and lets go of the usual invoker (the owner released every record still
    /// in use first).
    func deallocate() {
        for page in 0..<2 * Self.maxPages {
            directory[page]?.deallocate()
        }
        if let invoker = usualInvoker {
            Unmanaged<AnyObject>.fromOpaque(invoker).release()
        }
        directory.deinitialize(count: Self.usualInvokerIndex + 1)
        directory.deallocate()
    }

    /// The usual invoker (unretained), nil until a C subscriber was admitted. On the loop
    /// thread, a walk reads it once before it starts: every record it calls with the
    /// `usualInvoker` bit was admitted — the invoker written — under the lock before the
    /// delivery took its arrival through that lock, and the invoker never changes once set.
    /// (An acquiring load, a plain one on x86: an admission may set it meanwhile.)
    @inline(__always)
    var usualInvoker: UnsafeRawPointer? { usual { UnsafeRawPointer(bitPattern: $0.pointee.load(ordering: .acquiring)) } }

    /// Under the lock, admitting a C subscriber with `invoker` (a retained `ForeignCallback`):
    /// whether it is the table's usual invoker — the first one admitted becomes it, and the
    /// table holds it (a reference of its own) until the flow's core goes.
    @inline(__always)
    func isUsualInvoker(_ invoker: UnsafeRawPointer) -> Bool {
        guard let current = usualInvoker else {
            _ = Unmanaged<AnyObject>.fromOpaque(invoker).retain()
            usual { $0.pointee.store(UInt(bitPattern: invoker), ordering: .releasing) }
            return true
        }
        return current == invoker
    }

    @inline(__always)
    static func page(of slot: Int32) -> (page: Int, offset: Int) {
        let x = (Int(slot) >> 4) + 1
        let page = Int.bitWidth - 1 - x.leadingZeroBitCount
        return (page, Int(slot) - firstPageSlots * ((1 << page) - 1))
    }

    @inline(__always)
    static func slots(inPage page: Int) -> Int { firstPageSlots << page }

    @inline(__always)
    func entry(_ slot: Int32) -> SubscriberEntry {
        let (page, offset) = Self.page(of: slot)
        return SubscriberEntry(directory[page].unsafelyUnwrapped + offset * stride)
    }

    /// The side record of `slot`: only once its page has side records (`makeSidePage`), and
    /// off the lock only for a record whose tag says it has one.
    @inline(__always)
    func side(_ slot: Int32) -> SubscriberSide {
        let (page, offset) = Self.page(of: slot)
        return SubscriberSide(directory[Self.maxPages + page].unsafelyUnwrapped + offset * SubscriberSide.stride)
    }

    /// The record of `slot` as a walk hands it over, with `tag` as just read.
    @inline(__always)
    func walked(_ slot: Int32, tag: UInt64) -> WalkedEntry {
        let (page, offset) = Self.page(of: slot)
        return WalkedEntry(
            entry: SubscriberEntry(directory[page].unsafelyUnwrapped + offset * stride),
            tag: tag, sidePage: directory + Self.maxPages + page, index: offset)
    }

    /// Makes the page of `slot` if it does not exist yet (its records free). Under the lock.
    @inline(__always)
    func makePage(for slot: Int32) {
        let (page, _) = Self.page(of: slot)
        if directory[page] == nil { makePage(page) }
    }

    /// Makes the side page of `slot` if it does not exist yet (zeroed). Under the lock, before
    /// the record that needs it is published.
    @inline(__always)
    func makeSidePage(for slot: Int32) {
        let (page, _) = Self.page(of: slot)
        guard directory[Self.maxPages + page] == nil else { return }
        let bytes = Self.slots(inPage: page) * SubscriberSide.stride
        let memory = UnsafeMutableRawPointer.allocate(byteCount: bytes, alignment: 16)
        memory.initializeMemory(as: UInt8.self, repeating: 0, count: bytes)
        directory[Self.maxPages + page] = memory
    }

    /// Whether the page of `slot` has side records (tests: only pages that need them do).
    func hasSidePage(for slot: Int32) -> Bool { directory[Self.maxPages + Self.page(of: slot).page] != nil }

    private func makePage(_ page: Int) {
        let count = Self.slots(inPage: page)
        let memory = UnsafeMutableRawPointer.allocate(byteCount: count * stride, alignment: 64)
        for index in 0..<count {
            (memory + index * stride)
                .bindMemory(to: Atomic<UInt64>.self, capacity: 1)
                .initialize(to: Atomic(SubscriberEntry.freeTag))
        }
        directory[page] = memory
    }

    /// Calls `body` with each record below `limit` (a `SlotPool.highWater` the caller read
    /// under the lock), in slot order, and its slot. The caller checks each record's tag.
    func forEach(below limit: Int32, _ body: (SubscriberEntry, Int32) -> Void) {
        var first = 0
        var page = 0
        let limit = Int(limit)
        while first < limit {
            let count = min(Self.slots(inPage: page), limit - first)
            let base = directory[page].unsafelyUnwrapped
            for index in 0..<count {
                body(SubscriberEntry(base + index * stride), Int32(first + index))
            }
            first += Self.slots(inPage: page)
            page += 1
        }
    }

    /// The loop's walk: a cursor over the live records below `limit` (a `SlotPool.highWater`
    /// read under the lock), in slot order, checking each one's tag just before handing it
    /// over (a callback may close others).
    @inline(__always)
    func live(below limit: Int32, stride: Int) -> LiveRecords {
        assert(stride == self.stride, "a walk with another flow's record size")
        return LiveRecords(directory: directory, stride: stride, limit: Int(limit))
    }
}

/// The loop's walk over a flow's live records, as a cursor: the flow calls each subscriber in
/// its own loop body (`while let subscriber = walk.next()`). With the walk taking a body
/// closure, the unspecialized generic caller called that closure once per record — a call
/// more per callback than the floor's, by the disassembly.
///
/// Also asks for the callback context of the record `prefetchDistance` ahead, when that
/// record is live — a live record's callback words change only on the loop thread, so reading
/// them here races with nothing.
struct LiveRecords {
    private let directory: UnsafeMutablePointer<UnsafeMutableRawPointer?>
    private let stride: Int
    private let limit: Int
    /// The page being walked, its first slot, its base, how many of its records to walk.
    private var page = 0
    private var first = 0
    private var base: UnsafeMutableRawPointer?
    private var count = 0
    private var index = 0
    /// Whether this page's walk asks for contexts ahead (`SubscriberPages.prefetchFromPage`).
    private var prefetching = false

    @inline(__always)
    fileprivate init(directory: UnsafeMutablePointer<UnsafeMutableRawPointer?>, stride: Int, limit: Int) {
        self.directory = directory
        self.stride = stride
        self.limit = limit
        if limit > 0 {
            base = directory[0]
            count = min(SubscriberPages.slots(inPage: 0), limit)
        }
    }

    @inline(__always)
    mutating func next() -> WalkedEntry? {
        while true {
            while index < count {
                let current = index
                index += 1
                let records = base.unsafelyUnwrapped
                // What the callback `prefetchDistance` records ahead will read first: its
                // closure context or userdata (the records themselves stream in order).
                if prefetching && current &+ SubscriberPages.prefetchDistance < count {
                    let ahead = SubscriberEntry(records + (current &+ SubscriberPages.prefetchDistance) &* stride)
                    if ahead.isLive { sf_prefetch(ahead.word1) }
                }
                let entry = SubscriberEntry(records + current &* stride)
                let tag = entry.tag.pointee.load(ordering: .sequentiallyConsistent)
                if SubscriberEntry.isLive(tag) {
                    return WalkedEntry(entry: entry, tag: tag, sidePage: directory + SubscriberPages.maxPages + page, index: current)
                }
            }
            first += SubscriberPages.slots(inPage: page)
            guard first < limit else { return nil }
            page += 1
            base = directory[page]
            count = min(SubscriberPages.slots(inPage: page), limit - first)
            index = 0
            prefetching = page >= SubscriberPages.prefetchFromPage
        }
    }
}

/// Which slots of a flow's `SubscriberPages` are in use: recycled through a free list (LIFO,
/// so churn stays on warm records), so that a subscribe in steady state allocates nothing.
/// Guarded by the flow's lock.
struct SlotPool {
    /// Slots handed out so far (the free ones below it are in `free`).
    private(set) var highWater: Int32 = 0
    private var free: [Int32] = []
    /// Slots in use (taken and not yet returned).
    private(set) var inUse = 0

    /// A slot for a new subscriber: a recycled one, or the next fresh one (the caller makes
    /// its page). Nil when every `Int32` slot is in use.
    @inline(__always)
    mutating func take() -> Int32? {
        if let slot = free.popLast() {
            inUse += 1
            return slot
        }
        guard highWater < Int32.max else { return nil }
        highWater += 1
        inUse += 1
        return highWater - 1
    }

    /// Returns `slots` at once (`give` each, in order): one copy under the flow's lock, however
    /// many a delivery or a retire job freed.
    @inline(__always)
    mutating func give(contentsOf slots: [Int32]) {
        inUse -= slots.count
        if !startedOver() { free.append(contentsOf: slots) }
    }

    /// Returns `slot` (its record released and marked free).
    @inline(__always)
    mutating func give(_ slot: Int32) {
        inUse -= 1
        if !startedOver() { free.append(slot) }
    }

    /// When none is in use any more, the pool starts over from slot 0, so walks stop scanning
    /// old holes. Whether it did.
    @inline(__always)
    private mutating func startedOver() -> Bool {
        guard inUse == 0 else { return false }
        free.removeAll(keepingCapacity: true)
        highWater = 0
        return true
    }
}
