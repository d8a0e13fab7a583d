#!/usr/bin/env node
// Node.js as a peer of loopflow-bench: the same rows, measured the same way, with Node's own
// EventEmitter on its own libuv loop (the main thread). Plain `node`, no npm dependencies.
// loopflow-bench runs it (Tools/Sources/LoopFlowBench/NodePeer.swift) with the parameters of
// its own rows and reads one JSON object from stdout; run by hand it prints the same.
//
//   node eventemitter-bench.js fanout  --sizes 1,100,10000,1000000 --updates 41
//       One emitter, a probe listener plus N more (N + 1 in all, as loopflow-bench's flow has a
//       probe subscriber plus N). Each listener does what the benchmark's callbacks do: the
//       first notes the time, the last computes (now - first) / N. One figure per emit; the
//       walk from the first listener to the last, not emit's own set-up (its copy of the
//       listener array). Warm-up emits first (JIT; by default enough for 10 000 listener
//       calls), then `updates` measured ones, each reported (loopflow-bench takes the median).
//       emit_ns_per_listener: the whole emit() call per listener, its set-up included (context;
//       not what loopflow-bench reports).
//       → {"fanout": [{"subscribers": N, "per_update_ns": [...], "emit_ns_per_listener": [...]}]}
//   node eventemitter-bench.js churn   --pairs 1000000 --background 0
//       on + off (removeListener) pairs per second on the main thread, with `background`
//       other listeners live on the same event (loopflow-bench's subscribe+close row has
//       none). A warm-up pass first (as many pairs, at least 100 000), then one measured pass.
//       → {"churn": {"pairs": P, "background": B, "per_second": x}}
//   node eventemitter-bench.js latency --samples 2000 --paced 1 --pacing-ns 50000
//       A worker_threads Worker is the foreign thread: it takes the time, posts i to the main
//       thread (parentPort.postMessage; the main loop is woken by uv_async_send), and spins
//       until the main thread's 'message' listener has stored i into a SharedArrayBuffer
//       (Atomics); then the time again. One in flight. Paced: a 50 µs busy pause after each
//       sample, so every sample is a wake-up from idle. Exactly loopflow-bench's set→callback
//       methodology, with set = postMessage and the callback = the listener. `warmup`
//       samples first, discarded.
//       → {"latency": {"paced": true, "samples_ns": [...]}}
// Every command also accepts --warmup N; every answer carries "node": process.version.
// Times are read with performance.now() (see `now` below).
'use strict';

const { EventEmitter } = require('node:events');
const { performance } = require('node:perf_hooks');

// Nanoseconds as a double (monotonic, per thread; only differences are used). performance.now()
// costs ~40 ns here against ~100 ns for process.hrtime.bigint(), which matters where the clock
// is read inside the measured walk (the fan-out's first and last listener).
const now = () => performance.now() * 1e6;

function parse(argv) {
    const options = { command: argv[0] };
    for (let i = 1; i < argv.length; i += 2) {
        if (!argv[i].startsWith('--') || i + 1 >= argv.length) throw new Error(`bad argument ${argv[i]}`);
        options[argv[i].slice(2)] = argv[i + 1];
    }
    return options;
}

function integer(options, name, fallback) {
    if (options[name] === undefined) return fallback;
    const value = Number(options[name]);
    if (!Number.isInteger(value) || value < 0) throw new Error(`--${name} wants a count, got ${options[name]}`);
    return value;
}

// MARK: fan-out

function fanOut(subscribers, updates, warmup) {
    const emitter = new EventEmitter();
    emitter.setMaxListeners(0);
    const total = subscribers + 1;
    let first = 0;
    let perCallback = 0;
    let published = 0;
    function listener(isFirst, isLast) {
        return (value) => {
            if (isFirst) first = now();
            if (isLast) {
                perCallback = (now() - first) / (total - 1);
                published = value;
            }
        };
    }
    for (let index = 0; index < total; index++) emitter.on('value', listener(index === 0, index === total - 1));
    const measured = [];
    const whole = [];
    for (let update = 1; update <= warmup + updates; update++) {
        const start = now();
        emitter.emit('value', update);
        const elapsed = now() - start;
        if (published !== update) throw new Error(`fan-out: update ${update} did not reach the last listener`);
        if (update > warmup) {
            measured.push(perCallback);
            whole.push(elapsed / total);
        }
    }
    emitter.removeAllListeners();
    return { subscribers, per_update_ns: measured, emit_ns_per_listener: whole };
}

// MARK: on/off churn

function churn(pairs, background) {
    const emitter = new EventEmitter();
    emitter.setMaxListeners(0);
    for (let i = 0; i < background; i++) emitter.on('value', () => {});
    // Like the benchmark's `{ _ in }`: a listener that captures nothing, made once.
    const listener = () => {};
    function pass(count) {
        const start = now();
        for (let i = 0; i < count; i++) {
            emitter.on('value', listener);
            emitter.off('value', listener);
        }
        return count / ((now() - start) / 1e9);
    }
    pass(Math.max(pairs, 100_000)); // warm-up (JIT)
    const perSecond = pass(pairs);
    if (emitter.listenerCount('value') !== background) throw new Error('churn: listeners left behind');
    return { pairs, background, per_second: perSecond };
}

// MARK: worker → main latency

function worker() {
    const { parentPort, workerData } = require('node:worker_threads');
    const arrived = new Int32Array(workerData.arrived);
    const { samples, warmup, paced, pacingNs } = workerData;
    const measured = new Float64Array(samples);
    for (let i = 1; i <= warmup + samples; i++) {
        const start = now();
        parentPort.postMessage(i);
        while (Atomics.load(arrived, 0) !== i) {}
        const elapsed = now() - start;
        if (i > warmup) measured[i - warmup - 1] = Math.round(elapsed);
        if (paced) {
            const resume = now() + pacingNs;
            while (now() < resume) {}
        }
    }
    parentPort.postMessage({ done: Array.from(measured) });
}

function latency(samples, warmup, paced, pacingNs) {
    const { Worker } = require('node:worker_threads');
    const arrived = new SharedArrayBuffer(4);
    const flag = new Int32Array(arrived);
    return new Promise((resolve, reject) => {
        const thread = new Worker(__filename, {
            argv: ['--worker'],
            workerData: { arrived, samples, warmup, paced, pacingNs },
        });
        thread.on('message', (message) => {
            if (typeof message === 'number') {
                Atomics.store(flag, 0, message);   // the "callback": publish what arrived
            } else {
                resolve({ paced, samples_ns: message.done });
            }
        });
        thread.on('error', reject);
        thread.on('exit', (code) => {
            if (code !== 0) reject(new Error(`latency worker exited with ${code}`));
        });
    });
}

// MARK: main

async function main() {
    const options = parse(process.argv.slice(2));
    const answer = { node: process.version };
    switch (options.command) {
        case 'fanout': {
            const sizes = (options.sizes ?? '1,100,10000,1000000').split(',').map(Number);
            const updates = integer(options, 'updates', 41);
            // Warm-up: enough emits that the listeners have run 10 000 times (V8 has optimized
            // them and emit, as in a program that has been running a while), at least 5.
            answer.fanout = sizes.map((size) =>
                fanOut(size, updates, integer(options, 'warmup', Math.max(5, Math.ceil(10_000 / (size + 1))))));
            break;
        }
        case 'churn':
            answer.churn = churn(integer(options, 'pairs', 1_000_000), integer(options, 'background', 0));
            break;
        case 'latency':
            answer.latency = await latency(
                integer(options, 'samples', 2000), integer(options, 'warmup', 200),
                integer(options, 'paced', 1) === 1, integer(options, 'pacing-ns', 50_000));
            break;
        default:
            throw new Error(`unknown command ${options.command} (fanout, churn, latency)`);
    }
    process.stdout.write(JSON.stringify(answer) + '\n');
}

const { isMainThread } = require('node:worker_threads');
if (!isMainThread) {
    worker();
} else {
    main().catch((error) => {
        process.stderr.write(`eventemitter-bench: ${error.message}\n`);
        process.exit(1);
    });
}
