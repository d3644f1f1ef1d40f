// Registers the public Durable Streams conformance suite with vitest.
// We call the library API instead of the package's CLI: the CLI's vitest run
// finds no test files (its runner lives under node_modules, which vitest's
// default include/exclude drop), and the API lets us size the long-poll
// timeouts for a server started with a short --long-poll-timeout-ms.
import { runConformanceTests } from "@durable-streams/server-conformance-tests"

const baseUrl = process.env.CONFORMANCE_TEST_URL
if (!baseUrl) throw new Error("CONFORMANCE_TEST_URL is not set (use ./run)")

runConformanceTests({ baseUrl, longPollTimeoutMs: 1000 })
