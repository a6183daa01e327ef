// Reads a block as an application does with a real client library, and prints what the
// library returned as one JSON line; used by tests/e2e/test_clients_blocks.py, which runs it
// against the proxy and against anvil and compares.
//
//   node read_blocks.cjs LIB URL BLOCK TX FUTURE
//
// LIB: ethers (v6 JsonRpcProvider) or viem (createPublicClient over http). BLOCK: a height
// with transactions, TX: one of its transaction hashes, FUTURE: a height the chain does not
// have yet, or "next": two blocks past the head when the wait begins. Prints {"block",
// "hashes", "receipts", "trace", "waited"}: the block with its transactions
// (ethers: getBlock(n, true) and its prefetchedTransactions; viem: getBlock with
// includeTransactions), the block's receipts (viem: getBlockReceipts; ethers has no method for
// it: provider.send("eth_getBlockReceipts")), debug_traceTransaction with the callTracer, and
// the FUTURE block once a poll of getBlock stops answering "no such block" (ethers: null;
// viem: BlockNotFoundError) — how both wait for a block. Any other error ends the poll:
// {"error"} is printed and the exit status is 1.
"use strict";

const path = require("path");

const [lib, url, blockArg, txHash, futureArg] = process.argv.slice(2);
const modules = process.env.CHAINSTATE_NODE_MODULES;
const block = Number(blockArg);
let future = Number(futureArg);
const POLL_MS = 100;
const WAIT_MS = 30000;

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const plain = (value) =>
  JSON.parse(JSON.stringify(value, (_, v) => (typeof v === "bigint" ? `bigint:${v}` : v)));

async function poll(read) {
  const deadline = Date.now() + WAIT_MS;
  let polls = 0;
  while (Date.now() < deadline) {
    polls += 1;
    const found = await read();
    if (found) return { polls, block: found };
    await sleep(POLL_MS);
  }
  throw new Error(`block ${future} did not arrive in ${WAIT_MS} ms`);
}

async function withEthers() {
  const ethers = require(path.join(modules, "ethers"));
  const network = new ethers.Network("devnet", 1337);
  // cacheTimeout -1: ethers would otherwise answer a repeated getBlock from its own cache.
  const provider = new ethers.JsonRpcProvider(url, network, { staticNetwork: network, cacheTimeout: -1 });
  try {
    const got = await provider.getBlock(block, true);
    const hashes = await provider.getBlock(block, false);
    const receipts = await provider.send("eth_getBlockReceipts", [ethers.toQuantity(block)]);
    const trace = await provider.send("debug_traceTransaction", [txHash, { tracer: "callTracer" }]);
    if (futureArg === "next") future = (await provider.getBlockNumber()) + 2;
    const waited = await poll(() => provider.getBlock(future));
    return {
      block: { ...got.toJSON(), prefetchedTransactions: got.prefetchedTransactions.map((t) => t.toJSON()) },
      hashes: hashes.toJSON(),
      receipts,
      trace,
      waited: { polls: waited.polls, number: waited.block.number, hash: waited.block.hash },
    };
  } finally {
    provider.destroy();
  }
}

async function withViem() {
  const viem = require(path.join(modules, "viem"));
  const client = viem.createPublicClient({ transport: viem.http(url), cacheTime: 0 });
  const got = await client.getBlock({ blockNumber: BigInt(block), includeTransactions: true });
  const hashes = await client.getBlock({ blockNumber: BigInt(block) });
  const receipts = await client.getBlockReceipts({ blockNumber: BigInt(block) });
  const trace = await client.request({ method: "debug_traceTransaction", params: [txHash, { tracer: "callTracer" }] });
  if (futureArg === "next") future = Number(await client.getBlockNumber()) + 2;
  const waited = await poll(async () => {
    try {
      return await client.getBlock({ blockNumber: BigInt(future) });
    } catch (error) {
      if (error instanceof viem.BlockNotFoundError) return null;
      throw error;
    }
  });
  return {
    block: plain(got),
    hashes: plain(hashes),
    receipts: plain(receipts),
    trace,
    waited: { polls: waited.polls, number: Number(waited.block.number), hash: waited.block.hash },
  };
}

(lib === "ethers" ? withEthers() : withViem())
  .then((result) => {
    process.stdout.write(JSON.stringify(result) + "\n");
  })
  .catch((error) => {
    process.stdout.write(JSON.stringify({ error: String(error && error.stack ? error.stack : error) }) + "\n");
    process.exit(1);
  });
