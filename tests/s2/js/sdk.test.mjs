// Drives Runnel's S2 face with the public TypeScript S2 SDK (@s2-dev/streamstore):
// basin and stream creation, unary JSON appends of string records with headers,
// unary reads, a live SSE read session, check-tail, match_seq_num and fencing
// failures surfaced as errors.
//
// Transport: `forceTransport: "fetch"` (HTTP/1.1: JSON unary appends, SSE reads);
// Runnel serves neither S2S nor protobuf. With a custom basin endpoint the SDK
// sends the basin in the `s2-basin` header on every basin-scoped request
// (S2Endpoints.includeBasinHeader), which is what Runnel routes on.
// Run by ../run, which sets RUNNEL_URL (e.g. http://127.0.0.1:PORT).
import { after, before, describe, test } from "node:test"
import assert from "node:assert/strict"
import {
  AppendInput,
  AppendRecord,
  FencingTokenMismatchError,
  RangeNotSatisfiableError,
  S2,
  SeqNumMismatchError,
} from "@s2-dev/streamstore"

const BASE = process.env.RUNNEL_URL
if (!BASE) throw new Error("RUNNEL_URL is not set (use tests/s2/run)")

// How long to wait for something the server should do promptly.
const WAIT_MS = 10_000
// node:test backstop per test, above WAIT_MS so our own messages win.
const TEST_OPTS = { timeout: 3 * WAIT_MS }

const client = new S2({
  accessToken: "ignored",
  endpoints: { account: BASE, basin: BASE },
  // A failing request should fail the test, not be retried.
  retry: { maxAttempts: 1 },
})

function uniqueName(prefix) {
  // S2 basin names: 8-48 of [a-z0-9-], starting and ending with a letter or digit.
  return `${prefix}-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`
}

function withTimeout(promise, what) {
  let timer
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${WAIT_MS} ms waiting for ${what}`)), WAIT_MS)
  })
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer))
}

function strings(records) {
  return records.map((r) => AppendRecord.string(typeof r === "string" ? { body: r } : r))
}

describe("S2 TypeScript SDK against Runnel", () => {
  const basinName = uniqueName("js")
  let basin

  before(async () => {
    const info = await withTimeout(client.basins.create({ basin: basinName }), "basin creation")
    assert.equal(info.name, basinName)
    basin = client.basin(basinName)
  })

  after(async () => {
    await client.basins.delete({ basin: basinName }).catch(() => {})
  })

  async function newStream(name = uniqueName("s")) {
    await withTimeout(basin.streams.create({ stream: name }), "stream creation")
    return basin.stream(name, { forceTransport: "fetch" })
  }

  test("creates a basin and a stream, and lists them", TEST_OPTS, async () => {
    const stream = await newStream("listed")
    const basins = await client.basins.list({ prefix: basinName })
    assert.deepEqual(basins.basins.map((b) => b.name), [basinName])
    const streams = await basin.streams.list()
    assert.ok(streams.streams.map((s) => s.name).includes(stream.name))
    const tail = await stream.checkTail()
    assert.equal(tail.tail.seqNum, 0)
  })

  test("appends string records with headers and reads them back (unary)", TEST_OPTS, async () => {
    const stream = await newStream()
    const ack = await stream.append(
      AppendInput.create(strings([{ body: "one", headers: [["k", "v"], ["k", "w"]] }, "two"])),
    )
    assert.equal(ack.start.seqNum, 0)
    assert.equal(ack.end.seqNum, 2)
    assert.equal(ack.tail.seqNum, 2)

    const batch = await stream.read({ start: { from: { seqNum: 0 } }, stop: { limits: { count: 10 } } })
    assert.deepEqual(batch.records.map((r) => r.seqNum), [0, 1])
    assert.deepEqual(batch.records.map((r) => r.body), ["one", "two"])
    assert.deepEqual(batch.records[0].headers.map((h) => [...h]), [["k", "v"], ["k", "w"]])
    assert.ok(batch.records[0].timestamp instanceof Date)
  })

  test("check-tail reports the next seq_num", TEST_OPTS, async () => {
    const stream = await newStream()
    await stream.append(AppendInput.create(strings(["a", "b", "c"])))
    const { tail } = await stream.checkTail()
    assert.equal(tail.seqNum, 3)
  })

  test("a live read session (SSE) sees a record appended after it started", TEST_OPTS, async () => {
    const stream = await newStream()
    await stream.append(AppendInput.create(strings(["old"])))
    const session = await withTimeout(
      stream.readSession({ start: { from: { seqNum: 1 } } }),
      "the read session to open",
    )
    try {
      const records = session[Symbol.asyncIterator]()
      const first = records.next()
      // The server's ping on reaching the tail marks the session as caught up.
      await withTimeout(session.caughtUp(), "the session to catch up")
      const ack = await stream.append(AppendInput.create(strings([{ body: "live", headers: [["h", "1"]] }])))
      const { value, done } = await withTimeout(first, "the live record")
      assert.equal(done, false)
      assert.equal(value.seqNum, ack.start.seqNum)
      assert.equal(value.body, "live")
      assert.deepEqual(value.headers.map((h) => [...h]), [["h", "1"]])
      await records.return?.()
    } finally {
      await session.cancel().catch(() => {})
    }
  })

  test("a read beyond the tail is a RangeNotSatisfiableError", TEST_OPTS, async () => {
    const stream = await newStream()
    await stream.append(AppendInput.create(strings(["x"])))
    await assert.rejects(
      stream.read({ start: { from: { seqNum: 5 } } }),
      (err) => err instanceof RangeNotSatisfiableError && err.tail?.seqNum === 1,
    )
  })

  test("a match_seq_num failure is surfaced as SeqNumMismatchError", TEST_OPTS, async () => {
    const stream = await newStream()
    await stream.append(AppendInput.create(strings(["a", "b"]), { matchSeqNum: 0 }))
    await assert.rejects(
      stream.append(AppendInput.create(strings(["c"]), { matchSeqNum: 0 })),
      (err) => err instanceof SeqNumMismatchError && err.expectedSeqNum === 2 && err.status === 412,
    )
    const ack = await stream.append(AppendInput.create(strings(["c"]), { matchSeqNum: 2 }))
    assert.equal(ack.start.seqNum, 2)
  })

  test("fencing: a fence record sets the token that conditional appends must carry", TEST_OPTS, async () => {
    const stream = await newStream()
    const fenced = await stream.append(AppendInput.create([AppendRecord.fence("writer-1")]))
    assert.equal(fenced.end.seqNum, 1)
    await assert.rejects(
      stream.append(AppendInput.create(strings(["intruder"]), { fencingToken: "writer-2" })),
      (err) =>
        err instanceof FencingTokenMismatchError && err.expectedFencingToken === "writer-1" && err.status === 412,
    )
    const ack = await stream.append(AppendInput.create(strings(["owner"]), { fencingToken: "writer-1" }))
    assert.equal(ack.start.seqNum, 1)
    const batch = await stream.read({ start: { from: { seqNum: 0 } }, stop: { limits: { count: 10 } } })
    assert.deepEqual(batch.records.map((r) => r.body), ["writer-1", "owner"])
    assert.deepEqual(batch.records[0].headers.map((h) => [...h]), [["", "fence"]])
  })
})
