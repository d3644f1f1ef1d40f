// Drives a running server with the public TypeScript client
// (@durable-streams/client): create, append, catch-up read, SSE and long-poll
// tails, and close, for a text stream and a JSON stream.
// Run by ../run, which sets RUNNEL_URL (e.g. http://127.0.0.1:PORT).
import { after, describe, test } from "node:test"
import assert from "node:assert/strict"
import { DurableStream, stream } from "@durable-streams/client"

const BASE = process.env.RUNNEL_URL
if (!BASE) throw new Error("RUNNEL_URL is not set (use tests/clients/run)")

// How long to wait for something the server should do promptly.
const WAIT_MS = 10_000
// node:test backstop per test, above WAIT_MS so our own messages win.
const TEST_OPTS = { timeout: 3 * WAIT_MS }
// The client retries failed requests forever by default; a test should fail.
const CLIENT_OPTS = { backoffOptions: { initialDelay: 100, maxDelay: 1000, multiplier: 2, maxRetries: 3 } }

function uniqueUrl(kind) {
  const id = `${process.pid}-${Date.now()}-${Math.random().toString(36).slice(2, 8)}`
  return `${BASE}/v1/stream/js-${kind}-${id}`
}

function withTimeout(promise, what) {
  let timer
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${WAIT_MS} ms waiting for ${what}`)), WAIT_MS)
  })
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer))
}

// A live reader that records what it receives, and lets a test wait until
// what it has seen satisfies a condition (no sleeping).
async function liveTail(url, live, json) {
  const res = await stream({ url, offset: "now", live, json, ...CLIENT_OPTS })
  const seen = { items: [], text: "" }
  const waiters = new Set()
  let failure = null
  const check = () => {
    for (const w of waiters) {
      if (failure) w.reject(failure)
      else if (w.cond(seen)) w.resolve()
      else continue
      waiters.delete(w)
    }
  }
  const record = (chunk) => {
    if (json) seen.items.push(...chunk.items)
    else seen.text += chunk.text
    check()
  }
  if (json) res.subscribeJson(record)
  else res.subscribeText(record)
  res.closed.catch((err) => {
    failure = err
    check()
  })
  return {
    res,
    seen,
    until(cond, what) {
      const p = new Promise((resolve, reject) => waiters.add({ cond, resolve, reject }))
      check()
      return withTimeout(p, what)
    },
  }
}

// The two kinds of stream, with what is appended to each and how a reader's
// view is compared.
const KINDS = [
  {
    name: "text",
    contentType: "text/plain",
    json: false,
    initial: ["hello ", "world"],
    // The SSE message starts with a space: SSE parsers drop one after `data:`, and the
    // client must still get it back whole.
    liveMsgs: { sse: " via-sse|", "long-poll": "via-long-poll|" },
    encode: (m) => m,
    view: (seen) => seen.text,
    join: (msgs) => msgs.join(""),
    read: (res) => res.text(),
  },
  {
    name: "json",
    contentType: "application/json",
    json: true,
    initial: [{ n: 1, s: "one" }, { n: 2, nested: { ok: true } }],
    liveMsgs: { sse: { via: "sse" }, "long-poll": { via: "long-poll" } },
    encode: (m) => JSON.stringify(m),
    view: (seen) => seen.items,
    join: (msgs) => msgs,
    read: (res) => res.json(),
  },
]

for (const kind of KINDS) {
  describe(`${kind.name} stream`, () => {
    const url = uniqueUrl(kind.name)
    const written = [] // every message appended, in order
    const tails = {} // live readers kept open until the close test
    let ds

    after(() => {
      for (const t of Object.values(tails)) t.res.cancel()
    })

    test("create (PUT)", TEST_OPTS, async () => {
      ds = await DurableStream.create({ url, contentType: kind.contentType, ...CLIENT_OPTS })
      const head = await ds.head()
      assert.equal(head.exists, true)
      assert.match(head.contentType, new RegExp(`^${kind.contentType}`))
      assert.equal(head.streamClosed, false)
    })

    test("append (POST)", TEST_OPTS, async () => {
      const before = (await ds.head()).offset
      for (const m of kind.initial) {
        await ds.append(kind.encode(m))
        written.push(m)
      }
      const afterOffset = (await ds.head()).offset
      assert.ok(afterOffset > before, `tail offset should advance: ${before} -> ${afterOffset}`)
    })

    test("catch-up read", TEST_OPTS, async () => {
      const res = await stream({ url, live: false, json: kind.json, ...CLIENT_OPTS })
      assert.deepEqual(await kind.read(res), kind.join(written))
      assert.equal(res.upToDate, true)
      assert.equal(res.streamClosed, false)
    })

    for (const live of ["sse", "long-poll"]) {
      test(`${live} tail from offset now sees a new append`, TEST_OPTS, async () => {
        // stream() returns once the server answered, so "now" is fixed
        // before we append.
        const tail = await liveTail(url, live, kind.json)
        tails[live] = tail
        const msg = kind.liveMsgs[live]
        await ds.append(kind.encode(msg))
        written.push(msg)
        const expected = kind.join([msg])
        await tail.until((s) => kind.view(s).length >= expected.length, `the ${live} reader to get the append`)
        assert.deepEqual(kind.view(tail.seen), expected, "a tail from now must see only new data")
      })
    }

    test("close (Stream-Closed) is seen by readers and head()", TEST_OPTS, async () => {
      const { finalOffset } = await ds.close()
      const head = await ds.head()
      assert.equal(head.streamClosed, true)
      assert.equal(head.offset, finalOffset)

      // The live readers started earlier end their sessions by themselves,
      // at the final offset, in the closed state, having seen every append
      // made since they started.
      for (const [live, tail] of Object.entries(tails)) {
        await withTimeout(tail.res.closed, `the ${live} session to end`)
        assert.equal(tail.res.streamClosed, true, `${live} reader sees the close`)
        assert.equal(tail.res.offset, finalOffset, `${live} reader ends at the final offset`)
        const sinceStart = written.slice(written.indexOf(kind.liveMsgs[live]))
        assert.deepEqual(kind.view(tail.seen), kind.join(sinceStart), `${live} reader content`)
      }

      // A new reader sees everything and the closed state.
      const res = await stream({ url, live: false, json: kind.json, ...CLIENT_OPTS })
      assert.deepEqual(await kind.read(res), kind.join(written))
      assert.equal(res.streamClosed, true)

      // A closed stream rejects appends with 409. (Client 0.2.7 raises a
      // FetchError here rather than the StreamClosedError its docs name.)
      await assert.rejects(ds.append(kind.encode(kind.initial[0])), (err) => err.status === 409)
    })
  })
}
