// A small tour of LoopFlow: an owned loop, a StateFlow observed by a callback and by an
// async sequence, a SharedFlow event bus, a timer, and a teardown report.
import LoopFlow
import Synchronization

enum Connectivity: String, Sendable, Equatable {
    case offline, connecting, online
}

let loop = try EventLoop(name: "demo-loop")
let state = MutableStateFlow(Connectivity.offline, on: loop)
let events = try MutableSharedFlow<String>(on: loop, replay: 1, bufferCapacity: 16)

let stateSubscription = try state.subscribe(
    onState: { print("[callback] connectivity is \($0.rawValue)") },
    onComplete: { print("[callback] connectivity flow completed") },
    onRelease: { print("[callback] state subscription released") })
let eventSubscription = try events.subscribe(onEvent: { print("[event] \($0)") })

let watcher = Task {
    for await value in state.values {
        print("[async] connectivity is \(value.rawValue)")
        if value == .online { break }  // leaving the loop closes its subscription
    }
}

// A timer on the loop drives the story; every callback above runs on the loop thread.
let steps: [Connectivity] = [.connecting, .connecting, .online]
let step = Atomic<Int>(0)
let timer = try loop.scheduleTimer(after: .milliseconds(100), repeating: .milliseconds(100)) {
    let index = step.add(1, ordering: .relaxed).oldValue
    guard index < steps.count else { return }
    events.emit("step \(index + 1): set \(steps[index].rawValue)")
    state.value = steps[index]  // an equal value (the second "connecting") notifies no one
}

await watcher.value
try await Task.sleep(for: .milliseconds(200))
timer.cancel()
print("subscriptions open on the state flow: \(state.subscriptionCount.value)")
stateSubscription.close()
_ = eventSubscription  // left open on purpose: teardown completes it and reports it
let report = try loop.shutdown()
print("loop shut down: \(report.unclosedSubscriptions) subscription(s) were never closed")

