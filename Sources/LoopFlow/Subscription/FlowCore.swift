// One type in one file (over 500 lines): its lock-guarded state (pending delivery, arrivals, the
// terminal, the slots) is `private`/`private(set)` so that only this file changes it, under the
// one lock. What can stand apart already does: SubscriberTable.swift, SlotStack.swift,
// WalkGate.swift.

import Synchronization

/// The subscription machinery every flow shares: its lock, the pending delivery, arrivals,
/// the terminal state, the subscriber records and the observable subscription count.
///
/// A flow keeps its own data (a value, a ring of events) under `lock` too, so that one
/// critical section snapshots the data *and* the arrivals: a subscriber admitted before a
/// snapshot is registered before that snapshot is delivered, so it misses nothing.
///
/// Every flow delivers through the one `deliver()` here (lock → snapshot, arrivals and
/// terminal → unlock → register arrivals → walk → terminal); a flow supplies only its
/// snapshot and its broadcast (`DeliverySource`).
///
/// Subscribers live in `table`, pooled records at fixed addresses (`SubscriberTable`):
/// subscribing takes a record under the lock, fills it, and queues its slot as an arrival
/// (a StateFlow's loop-thread subscribe: in the loop's own list, and into a spare record
/// without the lock when there is one — `admitIntoSpare`); the next delivery registers the
/// arrivals (sets their `registered` bit), then walks the records. A close of an arrival no
/// delivery has taken yet, and is the latest, frees its record at once for the closing
/// thread's next subscribe (`reclaimLocally`, `reclaimElsewhere`). Closing sets the record's `closed` bit (one compare-and-swap, any thread) and
/// queues the slot for retirement; retirement is batched — every close since the last
/// retire job costs that one job — and runs on the loop thread outside any walk, where it
/// releases the record's callbacks (running `onRelease`) and returns the slot to the pool.
/// The only releases inside a walk are a terminal walk's own, each record after its own
/// terminal callback; slots return to the pool only after a walk. A walk reads records in
/// place.
///
/// While any record is in use, the loop holds the core (`EventLoop.hold`): an open
/// subscription whose handle and flow were dropped still gets its completion and release at
/// teardown. Nothing holds a core weakly (that would move its reference count to a side
/// table, the slow path, on every handle's retain and release).
///
/// Hot state is `@exclusivity(unchecked)`: it is guarded by `lock` or confined to the loop
/// thread (ThreadSanitizer checks both), and the dynamic exclusivity check the compiler would
/// otherwise make on every access cost more than the delivery itself (measured with callgrind).
@usableFromInline
final class FlowCore: SubscriptionOwner, @unchecked Sendable {
    let loop: EventLoop
    /// Adaptive (spins a little before it sleeps): held for a few dozen nanoseconds, by the
    /// loop's delivery and by subscribing and closing threads at once — a thread that slept in
    /// the kernel each time it met the delivery paid microseconds for a wait of nanoseconds
    /// (with `reclaimElsewhere`, whose close takes it too: subscribe+close from a foreign
    /// thread 5.5 → 6.3 M/s, medians of 5 alternated runs; either change alone, 4.3–4.5).
    @usableFromInline let lock = Lock(spinning: true)

    // Guarded by lock.
    /// The flow while a delivery is pending (claimed, not yet taken by `deliver()`), strong:
    /// it keeps the flow, and so this core, alive for the unretained delivery job. Non-nil
    /// exactly when a delivery is scheduled.
    @exclusivity(unchecked) private var pendingSource: (any DeliverySource)?
    /// Slots admitted since the last delivery took them.
    @exclusivity(unchecked) private var arrivals: [Int32] = []
    @exclusivity(unchecked) private(set) var terminal: FlowTerminal?
    /// `terminal != nil`, without copying the terminal (and its error) on every set.
    @usableFromInline @exclusivity(unchecked) private(set) var isFinished = false
    /// Set by teardown's sweep: no one is admitted again and no delivery is claimed.
    @exclusivity(unchecked) private var tornDown = false
    /// Which records are in use (the records' own fields: see `SubscriberEntry`).
    @exclusivity(unchecked) private var pool = SlotPool()
    /// Closed off the loop thread since the last retire job took them.
    @exclusivity(unchecked) private var closedElsewhere: [ClosedSlot] = []
    /// A retire job is queued for `closedElsewhere`.
    @exclusivity(unchecked) private var retireClaimed = false
    /// A delivery was claimed but its job refused (teardown had begun) while records were
    /// in use: the sweep would run it, unless the last record is freed first (`returnFreed`).
    @exclusivity(unchecked) private var deliveryRefused = false
    /// Records an off-loop close freed at once (`reclaimElsewhere`): free, still counted in
    /// the pool, for the next off-loop admission to take; the next delivery returns the rest
    /// to the pool. Never without a delivery pending (they came out of `arrivals`).
    @exclusivity(unchecked) private var foreignSpares = SlotStack()
    /// The callback contexts of those records, let go of by that delivery, on the loop.
    @exclusivity(unchecked) private var foreignReclaimedContexts: [UnsafeRawPointer] = []

    /// The flow, set once at its birth. Unowned: the flow owns the core. Read only by the
    /// flow's own calls (a claim), so it is alive whenever it is read; the existential is
    /// made once here instead of at every post (a generic conformance's witness table is
    /// looked up in the runtime's cache each time it is made).
    unowned(unsafe) var source: (any DeliverySource)?
    /// The loop's walk gate (one load less per walk than through `loop`).
    let gate: WalkGate
    /// A StateFlow's core: its admissions need nothing read under the lock (a SharedFlow's
    /// take their first sequence there), so those on the loop thread may keep their arrival
    /// in the loop's own list (`admit`).
    private let admitsLocally: Bool
    /// The records themselves, at fixed addresses (read without the lock: see there): 24
    /// bytes each, or 32 for a flow whose records keep a cursor (a SharedFlow's).
    private let table: SubscriberPages

    // Loop-confined.
    @exclusivity(unchecked) private var arrivalBatch: [Int32] = []
    /// A StateFlow's admissions made on the loop thread since the last delivery took them
    /// (the delivery appends them to its batch). Never without a delivery pending
    /// (`localClaimed`).
    @exclusivity(unchecked) private var localArrivals = SlotStack()
    /// Records a loop-thread close freed at once (`reclaimLocally`): free, still counted in
    /// the pool, for the next loop-thread admission to take without the lock; the next
    /// delivery returns the rest to the pool. Never without a delivery pending.
    @exclusivity(unchecked) private var spareSlots = SlotStack()
    /// The callback contexts of the records `reclaimLocally` freed, let go of by the next
    /// delivery (never inside `close()`: a captured object's deinit is user code).
    @exclusivity(unchecked) private var reclaimedContexts: [UnsafeRawPointer] = []
    @exclusivity(unchecked) private var releasingContexts: [UnsafeRawPointer] = []
    /// A delivery is pending that has not started yet: it will take `localArrivals` and
    /// `spareSlots`. Set by a loop-thread admission under the lock; cleared by the delivery
    /// (and wherever else a pending delivery is dropped).
    @exclusivity(unchecked) private var localClaimed = false
    /// The loop thread's own block of ids for lock-free admissions.
    @exclusivity(unchecked) private var localNextID: UInt64 = 0
    @exclusivity(unchecked) private var localIDLimit: UInt64 = 0
    /// The arrivals the delivery under way registered.
    @exclusivity(unchecked) private var newcomers: [Int32] = []
    /// The table's high-water mark at the delivery's snapshot: every registered slot is below.
    @exclusivity(unchecked) private var walkLimit: Int32 = 0
    /// Closed on the loop thread since the last retire job.
    @exclusivity(unchecked) private var closedHere: [ClosedSlot] = []
    @exclusivity(unchecked) private var retireQueuedHere = false
    @exclusivity(unchecked) private var retiring: [ClosedSlot] = []
    /// Records released, to return to the pool under one lock.
    @exclusivity(unchecked) private var freeing: [Int32] = []
    /// How many subscriptions got a terminal callback from this flow, ever.
    private var terminatedTotal = 0
    #if DEBUG
    /// Retire jobs run so far (tests: many closes cost one job). Debug builds only, like
    /// `admissionsBegun`: instrumentation for the tests, not part of the shipped library.
    private(set) var retireJobsRun = 0
    #endif

    /// The next id this flow hands out, and the end of its reserved block. Guarded by lock.
    @exclusivity(unchecked) private var nextID: UInt64 = 0
    @exclusivity(unchecked) private var idLimit: UInt64 = 0

    #if DEBUG
    /// Debug builds (the tests): admissions that passed the loop's check, so a test can see
    /// one waiting for `lock`. Absent from release builds (an atomic add per subscribe).
    let admissionsBegun = Atomic<Int>(0)
    /// Debug builds (the tests): runs in an off-loop close between its compare-and-swap and
    /// `reclaimElsewhere`'s lock, so a test can make a delivery and another admission happen
    /// there. Set before the flow is shared.
    var beforeReclaimElsewhere: (@Sendable () -> Void)?
    /// Debug builds (the tests): records an off-loop close freed for the next admission.
    var foreignSpareCount: Int { lock.withLock { foreignSpares.count } }
    #endif

    private let countLock = Lock()
    private var countFlow: MutableStateFlow<Int>?   // guarded by countLock, made on first use
    private let countObserved = Atomic<Bool>(false)

    struct ClosedSlot {
        let slot: Int32
        let id: UInt64
    }

    init(loop: EventLoop, admitsLocally: Bool = false, keepsCursors: Bool = false) {
        self.loop = loop
        self.gate = loop.walkGate
        self.admitsLocally = admitsLocally
        self.table = SubscriberPages(
            stride: keepsCursors ? SubscriberEntry.sequencedStride : SubscriberEntry.valueStride)
    }

    deinit {
        // The loop held the core while a record was in use: none is.
        table.deallocate()
        localArrivals.deallocate()
        spareSlots.deallocate()
        foreignSpares.deallocate()
    }

    /// Subscriptions not yet retired (a closed one counts until the loop has released it,
    /// within a loop turn), and the spare records (`spareSlots`, `foreignSpares`: a delivery
    /// is pending and returns them). Caller holds `lock`.
    @usableFromInline var liveCount: Int { pool.inUse }

    // MARK: Subscription count

    func subscriptionCount() -> StateFlow<Int> {
        countLock.withLock {
            if let countFlow { return countFlow }
            // Announce the flow before reading the count: a change that does not see the
            // announcement was made before this read (the read takes `lock` after the
            // announcement, the change checks it after releasing `lock`).
            countObserved.store(true, ordering: .sequentiallyConsistent)
            let flow = MutableStateFlow(lock.withLock { pool.inUse }, on: loop)
            countFlow = flow
            return flow
        }
    }

    /// Free until someone asks for `subscriptionCount`; then each change publishes the
    /// count of the moment under `countLock` (so publications never go backwards). Called
    /// after a change, without `lock`.
    @inline(__always)
    private func publishCount() {
        guard countObserved.load(ordering: .sequentiallyConsistent) else { return }
        publishCountNow()
    }

    private func publishCountNow() {
        countLock.withLock {
            countFlow?.value = lock.withLock { pool.inUse }
        }
    }

    /// Slots handed out so far: every record in use is below (tests: recycling).
    var recordHighWater: Int32 { lock.withLock { pool.highWater } }

    /// Where the record of `slot` is and whether its page has side records (tests: the layout).
    func recordLayout(of slot: Int32) -> (address: UnsafeMutableRawPointer, hasSidePage: Bool) {
        lock.withLock { (table.entry(slot).raw, table.hasSidePage(for: slot)) }
    }

    /// Subscriptions admitted and neither closed nor completed (the shutdown report).
    func openSubscriptionCount() -> Int {
        lock.withLock {
            var open = 0
            table.forEach(below: pool.highWater) { entry, _ in
                let tag = entry.tag.pointee.load(ordering: .acquiring)
                if tag >> SubscriberEntry.idShift != 0 && tag & SubscriberEntry.closedBit == 0 { open += 1 }
            }
            return open
        }
    }

    // MARK: Any thread

    /// Admits a subscriber: counts it live, then under `lock` takes a record, fills it
    /// with the callbacks, runs `prepareLocked` (for the flow's own bookkeeping) and queues
    /// it for registration by the next delivery. On failure nothing is counted and none of
    /// the callbacks will ever run.
    ///
    /// `callback`'s references come retained; on a refusal they are released here.
    ///
    /// A StateFlow (`admitsLocally`) admitting on the loop thread keeps the arrival in
    /// `localArrivals`, which its pending delivery takes (its value-only subscribe tries
    /// `admitIntoSpare` first).
    func admit(
        _ callback: AdmittedCallback,
        onError: (@Sendable (any Error) -> Void)?,
        onComplete: (@Sendable () -> Void)?,
        onRelease: (@Sendable () -> Void)?,
        prepareLocked: ((SubscriberEntry, UInt64) -> Void)? = nil
    ) throws(LoopFlowError) -> FlowSubscription {
        let words = callback.words
        let foreign = callback.foreign
        let extras = SubscriberExtras.make(onError: onError, onComplete: onComplete, onRelease: onRelease)
        guard loop.acceptsWork else {
            refuse(words: words, foreign: foreign, extras: extras)
            throw LoopFlowError(.loopShutDown, "the event loop '\(loop.name)' is shut down")
        }
        #if DEBUG
        admissionsBegun.wrappingAdd(1, ordering: .sequentiallyConsistent)
        #endif
        assert(!admitsLocally || prepareLocked == nil, "a flow that admits locally reads nothing under the lock")
        let local = admitsLocally && loop.inEventLoop
        lock.lock()
        // Off the loop thread, a spare an off-loop close left first: counted in the pool
        // already, its lines still in this thread's cache (`reclaimElsewhere`).
        let spare = tornDown || local ? nil : foreignSpares.pop()
        guard !tornDown, let slot = spare ?? pool.take() else {
            let full = !tornDown
            lock.unlock()
            refuse(words: words, foreign: foreign, extras: extras)
            if full {
                throw LoopFlowError(.invalidConfiguration, "a flow holds at most \(Int32.max) subscriptions")
            }
            throw LoopFlowError(.loopShutDown, "the event loop '\(loop.name)' is shut down")
        }
        // The first record in use: the loop holds the core from here until the last is freed.
        if spare == nil && pool.inUse == 1 && !loop.hold(self) {
            pool.give(slot)
            tornDown = true
            lock.unlock()
            refuse(words: words, foreign: foreign, extras: extras)
            throw LoopFlowError(.loopShutDown, "the event loop '\(loop.name)' is shut down")
        }
        if nextID == idLimit {
            nextID = FlowSubscription.reserveIDs()
            idLimit = nextID + FlowSubscription.idBlock
        }
        let id = nextID
        nextID += 1
        table.makePage(for: slot)
        let entry = table.entry(slot)
        entry.word0 = words.0
        entry.word1 = words.1
        var tag = id << SubscriberEntry.idShift
        // The flow's usual invoker is held by the table, and a walk finds it there: the record
        // needs no side record for it (the admission's reference is let go of below).
        let usual = foreign.map { table.isUsualInvoker($0) } ?? false
        let sideForeign = usual ? nil : foreign
        if usual { tag |= SubscriberEntry.foreignBit | SubscriberEntry.usualInvokerBit }
        if sideForeign != nil || extras != nil {
            table.makeSidePage(for: slot)
            let side = table.side(slot)
            side.foreign = sideForeign
            side.extras = extras
            if sideForeign != nil { tag |= SubscriberEntry.foreignBit }
            if extras != nil { tag |= SubscriberEntry.extrasBit }
        }
        entry.tag.pointee.store(tag, ordering: .releasing)
        prepareLocked?(entry, id)
        let post = claimDeliveryLocked()
        if local {
            // A delivery is pending now (claimed here, or before and not started: it runs on
            // this thread), and takes the local arrivals with it.
            localArrivals.push(slot)
            localClaimed = true
        } else {
            arrivals.append(slot)
        }
        lock.unlock()
        if usual, let foreign { Unmanaged<AnyObject>.fromOpaque(foreign).release() }
        if post { postDelivery() }
        publishCount()
        return FlowSubscription(core: self, entry: entry, slot: slot, id: id)
    }

    /// A StateFlow's value-only subscribe on the loop thread into a spare record
    /// (`reclaimLocally`), with a delivery pending: no lock, no pool. Nil when it cannot be one
    /// (another thread, no spare, no delivery pending, the loop shutting down, the count
    /// observed: a spare is counted already, and taking it would not raise the count) — then
    /// `admit`, with the same retained `words`.
    ///
    /// The record is free and on an existing page, no other thread writes it (only a closer
    /// holding an old handle reads its tag, which no longer names that handle's id), and the
    /// pending delivery (`localClaimed`) registers it.
    @inline(__always)
    func admitIntoSpare(words: (UnsafeRawPointer?, UnsafeRawPointer?)) -> FlowSubscription? {
        // The loop thread first: everything after it is the loop's own state.
        guard admitsLocally, loop.inEventLoop, localClaimed, !spareSlots.isEmpty, loop.acceptsWork,
            !countObserved.load(ordering: .relaxed), let slot = spareSlots.pop()
        else { return nil }
        #if DEBUG
        admissionsBegun.wrappingAdd(1, ordering: .sequentiallyConsistent)
        #endif
        if localNextID == localIDLimit {
            localNextID = FlowSubscription.reserveIDs()
            localIDLimit = localNextID + FlowSubscription.idBlock
        }
        let id = localNextID
        localNextID += 1
        let entry = table.entry(slot)
        entry.word0 = words.0
        entry.word1 = words.1
        entry.tag.pointee.store(id << SubscriberEntry.idShift, ordering: .releasing)
        localArrivals.push(slot)
        return FlowSubscription(core: self, entry: entry, slot: slot, id: id)
    }

    /// Lets go of what a refused admission was handed retained.
    private func refuse(
        words: (UnsafeRawPointer?, UnsafeRawPointer?), foreign: UnsafeRawPointer?, extras: UnsafeRawPointer?
    ) {
        if let foreign {
            Unmanaged<AnyObject>.fromOpaque(foreign).release()
        } else if let context = words.1 {
            Unmanaged<AnyObject>.fromOpaque(context).release()
        }
        if let extras { Unmanaged<SubscriberExtras>.fromOpaque(extras).release() }
    }

    /// Caller holds `lock` and is a call of the flow (so `source` is alive). Returns whether
    /// the caller must post a delivery job (`postDelivery()`, after unlocking).
    @usableFromInline func claimDeliveryLocked() -> Bool {
        guard pendingSource == nil, !tornDown else { return false }
        assert(source != nil, "a flow claimed a delivery before it was born")
        pendingSource = source
        return true
    }

    /// Caller holds `lock`. Records the terminal state; nil if the flow had finished already.
    func finishLocked(error: (any Error)?) -> Bool? {
        guard terminal == nil else { return nil }
        terminal = FlowTerminal(error: error)
        isFinished = true
        return claimDeliveryLocked()
    }

    /// Posts a delivery claimed under the lock. Refused only once teardown has begun: a
    /// core with subscribers is held by the loop, and its sweep makes the delivery still
    /// pending; one without has nothing to deliver, and lets go of the flow it claimed for.
    @usableFromInline func postDelivery() {
        do {
            try loop.enqueue(.deliver(Unmanaged.passUnretained(self)), isInternal: true)
        } catch {
            let source: (any DeliverySource)? = lock.withLock {
                guard pool.inUse == 0 else {
                    deliveryRefused = true
                    return nil
                }
                return pendingSource.take()
            }
            withExtendedLifetime(source) {}
        }
    }

    /// Closes the subscription `id` if its record is still its own and open; then queues the
    /// record for retirement if it was registered. Any thread (`onLoop`: whether it is the loop's). Returns
    /// whether this call closed it. Not inlined: inlined into `FlowSubscription.close()`, the
    /// core was retained around its body (see there).
    @inline(never)
    func close(entry: SubscriberEntry, slot: Int32, id: UInt64, onLoop: Bool) -> Bool {
        let tag = entry.tag
        var current = tag.pointee.load(ordering: .sequentiallyConsistent)
        while true {
            guard current >> SubscriberEntry.idShift == id, current & SubscriberEntry.closedBit == 0 else { return false }
            let (exchanged, original) = tag.pointee.compareExchange(
                expected: current, desired: current | SubscriberEntry.closedBit, ordering: .sequentiallyConsistent)
            if exchanged { break }
            current = original
        }
        // Not registered yet: its arrival is still to be handled, on the loop thread, and the
        // registration (which sets `registered` on this same word) sees it closed and releases
        // it. Nothing to retire — unless it is the loop thread's latest arrival, freed here.
        guard current & SubscriberEntry.registeredBit != 0 else {
            if current & (SubscriberEntry.extrasBit | SubscriberEntry.foreignBit) == 0 {
                if !onLoop {
                    reclaimElsewhere(entry, slot: slot, closedTag: current | SubscriberEntry.closedBit)
                } else if localArrivals.last == slot {
                    reclaimLocally(entry, slot: slot)
                }
            }
            return true
        }
        let closed = ClosedSlot(slot: slot, id: id)
        if onLoop {
            closedHere.append(closed)
            guard !retireQueuedHere else { return true }
            retireQueuedHere = true
        } else {
            lock.lock()
            closedElsewhere.append(closed)
            let post = !retireClaimed
            retireClaimed = true
            lock.unlock()
            guard post else { return true }
        }
        do {
            try loop.enqueue(.retire(self), isInternal: true)
        } catch {
            // Teardown has begun: its sweep releases every record still in use.
        }
        return true
    }

    /// An off-loop close of a record whose arrival no delivery has taken yet and is the
    /// latest (a thread subscribing and closing at once): its record is freed now, under the
    /// lock, and kept as a spare for the next off-loop admission (`foreignSpares`). Without it
    /// the loop freed the record (its registration finds it closed) and the next subscribe on
    /// this thread took it back from the pool: its lines went to the loop's core and back for
    /// every pair. Only a record without a side record (no `onRelease` to defer); the
    /// closure's context is let go of by the pending delivery, on the loop (a captured
    /// object's deinit is user code: never inside `close()`, never off the loop). Not while
    /// the subscription count is observed (see `reclaimLocally`), nor once teardown has begun
    /// (the sweep's delivery frees it).
    ///
    /// `closedTag` is the tag this close left (its id, closed, not registered). Between that
    /// compare-and-swap and the lock a delivery may have taken the arrival and freed the
    /// record, and another subscriber taken it back (its arrival the latest again, the same
    /// slot): only the tag tells the record is still this subscription's. While it holds this
    /// id the record is not released, so the slot in `arrivals` is this one's arrival; a newer
    /// admission writes its own id under this same lock.
    private func reclaimElsewhere(_ entry: SubscriberEntry, slot: Int32, closedTag: UInt64) {
        guard !countObserved.load(ordering: .relaxed) else { return }
        #if DEBUG
        beforeReclaimElsewhere?()
        #endif
        lock.lock()
        defer { lock.unlock() }
        // Still in `arrivals`: no delivery has taken it, and one is pending (it was claimed
        // when the arrival was queued, and takes `arrivals` and the spares in one section).
        guard !tornDown, arrivals.last == slot, entry.tag.pointee.load(ordering: .relaxed) == closedTag else { return }
        arrivals.removeLast()
        if let context = Self.empty(entry) { foreignReclaimedContexts.append(context) }
        foreignSpares.push(slot)
    }

    // MARK: Loop thread

    /// A loop-thread close of the loop thread's latest arrival (never registered: no callback
    /// of it ran, and none will): its record is freed now and kept as a spare for the next
    /// loop-thread admission, so subscribing and closing on the loop thread reuses one warm
    /// record without the lock. Only a record without a side record (no `onRelease` to
    /// defer); the closure's context is let go of by the next delivery, as the registration
    /// would have (a captured object's deinit is user code: never inside `close()`). Not
    /// while the subscription count is observed: a closed subscription counts until the loop
    /// releases it, and the record's next subscriber would not raise the count.
    private func reclaimLocally(_ entry: SubscriberEntry, slot: Int32) {
        guard !countObserved.load(ordering: .relaxed) else { return }
        _ = localArrivals.pop()
        if let context = Self.empty(entry) { reclaimedContexts.append(context) }
        spareSlots.push(slot)
    }

    /// A reclaim's record, never registered and without a side record, made free (its next
    /// holder rewrites it); returns its closure's context, which the caller has let go of on
    /// the loop by the next delivery.
    @inline(__always)
    private static func empty(_ entry: SubscriberEntry) -> UnsafeRawPointer? {
        let context = entry.word1
        entry.word0 = nil
        entry.word1 = nil
        entry.tag.pointee.store(SubscriberEntry.freeTag, ordering: .releasing)
        return context
    }

    /// The one delivery of every flow: under the lock, the flow's snapshot, the arrivals
    /// and the terminal state; then, without it, the arrivals registered, the flow's
    /// broadcast and the terminal callbacks, inside one walk over the records.
    ///
    /// Returns the flow it delivered for, for the caller to let go of after this call
    /// (it may be the last reference to the flow, which owns this core). Nil if no delivery
    /// was pending.
    func deliver() -> (any DeliverySource)? {
        loop.assertInEventLoop()
        lock.lock()
        guard let source = pendingSource.take() else {
            assert(foreignSpares.isEmpty && foreignReclaimedContexts.isEmpty, "off-loop spares without a pending delivery")
            lock.unlock()
            assert(
                localArrivals.isEmpty && spareSlots.isEmpty && reclaimedContexts.isEmpty,
                "loop-thread arrivals without a pending delivery")
            return nil
        }
        deliveryRefused = false
        swap(&arrivals, &arrivalBatch)
        if !foreignSpares.isEmpty {
            // Back to the pool with the records this delivery frees (`returnFreed`).
            freeing.append(contentsOf: foreignSpares.elements)
            foreignSpares.removeAll()
        }
        if !foreignReclaimedContexts.isEmpty {
            // Let go of with the loop thread's own (`takeLocalArrivals`).
            reclaimedContexts.append(contentsOf: foreignReclaimedContexts)
            foreignReclaimedContexts.removeAll(keepingCapacity: true)
        }
        walkLimit = pool.highWater
        let terminal = self.terminal
        source.takeSnapshotLocked()
        lock.unlock()
        takeLocalArrivals()

        registerArrivals()
        gate.begin(ObjectIdentifier(self))
        source.broadcast()
        newcomers.removeAll(keepingCapacity: true)
        if let terminal {
            terminateAll(with: terminal.error)
        }
        gate.end()
        returnFreed()
        return source
    }

    /// The delivery has begun: the loop thread's arrivals join its batch, its spare records
    /// go back to the pool with the records this delivery frees, the callbacks of the records
    /// reclaimed are let go of (as the registration lets go of those closed before it), and
    /// the next loop-thread admission claims a delivery again.
    private func takeLocalArrivals() {
        localClaimed = false
        if !localArrivals.isEmpty {
            arrivalBatch.append(contentsOf: localArrivals.elements)
            localArrivals.removeAll()
        }
        if !spareSlots.isEmpty {
            freeing.append(contentsOf: spareSlots.elements)
            spareSlots.removeAll()
        }
        guard !reclaimedContexts.isEmpty else { return }
        // Last, the lists settled: a deinit may subscribe and close again (into the next
        // delivery's lists: it claims one).
        swap(&reclaimedContexts, &releasingContexts)
        for context in releasingContexts {
            Unmanaged<AnyObject>.fromOpaque(context).release()
        }
        releasingContexts.removeAll(keepingCapacity: true)
    }

    /// In a delivery, before the walk: registers the arrivals still open. One closed before
    /// it got here is released now (no callback of it has run); its retire job, if it still
    /// comes, finds the record no longer its own.
    private func registerArrivals() {
        for slot in arrivalBatch {
            let entry = table.entry(slot)
            var current = entry.tag.pointee.load(ordering: .sequentiallyConsistent)
            while true {
                if current & SubscriberEntry.closedBit != 0 {
                    release(entry, slot: slot)
                    break
                }
                let (exchanged, original) = entry.tag.pointee.compareExchange(
                    expected: current, desired: current | SubscriberEntry.registeredBit,
                    ordering: .sequentiallyConsistent)
                if exchanged {
                    newcomers.append(slot)
                    break
                }
                current = original
            }
        }
        arrivalBatch.removeAll(keepingCapacity: true)
    }

    /// Every registered, open record, in slot order, each one's tag checked just before it is
    /// handed over (a callback may close others): `while let subscriber = walk.next()`. Inside
    /// a walk only.
    ///
    /// `stride`: the flow's record size (`SubscriberEntry.valueStride` for a StateFlow,
    /// `.sequencedStride` for a SharedFlow), a constant at the walk's call site so that the
    /// walk's address arithmetic is folded (as a field read per record it measured slower).
    @inline(__always)
    func live(stride: Int) -> LiveRecords { table.live(below: walkLimit, stride: stride) }

    /// The flow's usual C invoker for `callSubscriber`, read once per walk: inside a delivery
    /// only (see `SubscriberPages.usualInvoker`).
    @inline(__always)
    var usualInvoker: UnsafeRawPointer? { table.usualInvoker }

    /// The records the delivery under way registered, still open.
    @inline(__always)
    func forEachNewcomer(_ body: (WalkedEntry) -> Void) {
        for slot in newcomers {
            let tag = table.entry(slot).tag.pointee.load(ordering: .sequentiallyConsistent)
            if SubscriberEntry.isLive(tag) { body(table.walked(slot, tag: tag)) }
        }
    }

    /// Terminal callback to every registered subscription still open, then release for
    /// all of them. Returns how many got the terminal callback. Call inside a walk of this
    /// flow (closers wait for it).
    @discardableResult
    private func terminateAll(with error: (any Error)?) -> Int {
        var terminated = 0
        table.forEach(below: walkLimit) { entry, slot in
            let tag = entry.tag.pointee.load(ordering: .sequentiallyConsistent)
            guard tag & SubscriberEntry.registeredBit != 0 else { return }
            if terminate(entry, slot: slot, with: error) { terminated += 1 }
            release(entry, slot: slot)
        }
        terminatedTotal += terminated
        return terminated
    }

    /// Delivers the terminal callback (error if given, else complete) unless the
    /// subscription is already closed. Returns whether it delivered.
    private func terminate(_ entry: SubscriberEntry, slot: Int32, with error: (any Error)?) -> Bool {
        var current = entry.tag.pointee.load(ordering: .sequentiallyConsistent)
        while true {
            guard current & SubscriberEntry.closedBit == 0 else { return false }
            let (exchanged, original) = entry.tag.pointee.compareExchange(
                expected: current, desired: current | SubscriberEntry.closedBit, ordering: .sequentiallyConsistent)
            if exchanged { break }
            current = original
        }
        if current & SubscriberEntry.extrasBit != 0, let extras = table.side(slot).extras {
            Unmanaged<SubscriberExtras>.fromOpaque(extras)._withUnsafeGuaranteedRef { extras in
                if let error {
                    extras.onError?(error)
                } else {
                    extras.onComplete?()
                }
            }
        }
        return true
    }

    /// After the last callback of the record's subscriber: lets go of its callbacks (a
    /// callback that captured its own handle must not keep the flow's core alive), marks
    /// the record free, runs `onRelease`, and queues the slot for the pool (`returnFreed`).
    private func release(_ entry: SubscriberEntry, slot: Int32) {
        // The flags hold while the record is held (a closer only sets `closed`).
        let tag = entry.tag.pointee.load(ordering: .sequentiallyConsistent)
        var extras: UnsafeRawPointer?
        var foreign: UnsafeRawPointer?
        // A side record holds extras, or a C subscriber's invoker that is not the usual one.
        if tag & SubscriberEntry.extrasBit != 0
            || tag & (SubscriberEntry.foreignBit | SubscriberEntry.usualInvokerBit) == SubscriberEntry.foreignBit {
            let side = table.side(slot)
            extras = side.extras
            foreign = side.foreign
            side.extras = nil
            side.foreign = nil
        }
        let context = entry.word1
        entry.word0 = nil
        entry.word1 = nil
        // Releasing is enough: the record is handed out again only through the lock (or, a
        // loop-thread spare, on this thread), and a closer holding an old handle only needs to
        // see that the id is no longer its own.
        entry.tag.pointee.store(SubscriberEntry.freeTag, ordering: .releasing)
        freeing.append(slot)
        if tag & SubscriberEntry.foreignBit != 0 {
            // A C subscriber: its words are a function and userdata, its invoker the side
            // record's (the table keeps the usual one).
            if let foreign { Unmanaged<AnyObject>.fromOpaque(foreign).release() }
        } else if let context {
            Unmanaged<AnyObject>.fromOpaque(context).release()
        }
        if let extras {
            let extras = Unmanaged<SubscriberExtras>.fromOpaque(extras).takeRetainedValue()
            extras.onRelease?()
        }
    }

    /// Returns the released records to the pool, under one lock; lets the core go when
    /// none is in use.
    private func returnFreed() {
        guard !freeing.isEmpty else { return }
        lock.lock()
        pool.give(contentsOf: freeing)
        var unused: (any SubscriptionOwner)?
        var refused: (any DeliverySource)?
        if pool.inUse == 0 {
            unused = loop.letGo(self)
            // No sweep will come for a core the loop no longer holds: a delivery whose job
            // was refused is dropped here (it has no one to deliver to), or the flow it holds
            // would keep itself and this core alive forever.
            if deliveryRefused {
                deliveryRefused = false
                refused = pendingSource.take()
            }
        }
        lock.unlock()
        freeing.removeAll(keepingCapacity: true)
        publishCount()
        withExtendedLifetime(unused) {}
        withExtendedLifetime(refused) {}
    }

    // MARK: SubscriptionOwner

    /// The retire job: every record closed since the last one, released.
    func retireClosed() {
        loop.assertInEventLoop()
        assertNotWalking()
        #if DEBUG
        retireJobsRun += 1
        #endif
        retireQueuedHere = false
        lock.lock()
        swap(&closedElsewhere, &retiring)
        retireClaimed = false
        lock.unlock()
        for closed in retiring {
            retire(closed)
        }
        retiring.removeAll(keepingCapacity: true)
        // By index: a release (user code) may close more on this thread, appending here;
        // they are retired in this pass, and the array keeps its capacity for the next.
        var index = 0
        while index < closedHere.count {
            retire(closedHere[index])
            index += 1
        }
        closedHere.removeAll(keepingCapacity: true)
        returnFreed()
    }

    private func retire(_ closed: ClosedSlot) {
        let entry = table.entry(closed.slot)
        let tag = entry.tag.pointee.load(ordering: .sequentiallyConsistent)
        // Released already (at registration, or by a terminal walk), or not yet registered
        // (its registration releases it).
        guard tag >> SubscriberEntry.idShift == closed.id, tag & SubscriberEntry.registeredBit != 0 else { return }
        release(entry, slot: closed.slot)
    }

    /// Walks call subscribers in place: a retire job releasing records during a walk over
    /// this flow would pull callbacks from under it. (Retire jobs never run inside a walk;
    /// this keeps a future path from doing it silently in debug builds. A terminal walk
    /// releases each record itself, after that record's last callback.)
    @inline(__always)
    private func assertNotWalking() {
        assert(!gate.isWalking(ObjectIdentifier(self)), "subscriber records released during a walk over them")
    }

    func sweepForTeardown() -> Int {
        let before = terminatedTotal
        // From here nothing is admitted or claimed. A delivery still pending (its job was
        // refused, or is being refused) runs last: arrivals that rode on it get their first
        // value (or replay) and, if the flow finished, its own terminal callback. With none
        // pending there are no arrivals, and the flow's subscribers have had everything.
        lock.withLock { tornDown = true }
        let source = deliver()
        lock.withLock { walkLimit = pool.highWater }
        gate.begin(ObjectIdentifier(self))
        terminateAll(with: nil)
        gate.end()
        // Every record is free now; closes still queued for retirement find them so.
        closedHere.removeAll()
        retireQueuedHere = false
        lock.withLock {
            closedElsewhere.removeAll()
            retireClaimed = false
        }
        returnFreed()
        withExtendedLifetime(source) {}
        // Everyone completed here was still open: whether by the flow's own terminal (a
        // layer finishing its flows at teardown) or by this sweep.
        return terminatedTotal - before
    }
}
