// Watches ERC20 Transfer events (or new blocks) through the proxy with a real client library,
// as a dapp does, and prints each one as a JSON line; used by tests/e2e/test_events_clients.py.
//
//   node watch_events.cjs MODE HTTP_URL WS_URL TOKEN
//
// MODE: ethers-ws (WebSocketProvider, contract.on), ethers-filter (JsonRpcProvider polling
// with eth_newFilter/eth_getFilterChanges, its default), ethers-getlogs (JsonRpcProvider
// polling with eth_getLogs), viem-http (watchContractEvent over http), viem-ws
// (watchContractEvent over webSocket), viem-blocks (watchBlocks over webSocket).
// Prints {"ready": true} once watching, {"tx", "index", "block"} per Transfer (or
// {"block", "hash"} per block), {"error"} on errors, and {"done": true} when stdin closes.
"use strict";

const path = require("path");

const [mode, httpUrl, wsUrl, token] = process.argv.slice(2);
const modules = process.env.CHAINSTATE_NODE_MODULES;
const ABI_EVENT = "event Transfer(address indexed from, address indexed to, uint256 value)";
const POLL_MS = 200;

function out(obj) {
  process.stdout.write(JSON.stringify(obj) + "\n");
}

function transfer(log) {
  out({ tx: log.transactionHash, index: Number(log.index ?? log.logIndex), block: Number(log.blockNumber) });
}

async function ethersWatch() {
  const ethers = require(path.join(modules, "ethers"));
  const network = new ethers.Network("devnet", 1337);
  let provider;
  if (mode === "ethers-ws") {
    provider = new ethers.WebSocketProvider(wsUrl, network, { staticNetwork: network });
  } else {
    const polling = mode === "ethers-getlogs";
    provider = new ethers.JsonRpcProvider(httpUrl, network, {
      staticNetwork: network,
      polling,
      pollingInterval: POLL_MS,
    });
    provider.pollingInterval = POLL_MS;
  }
  const contract = new ethers.Contract(token, [ABI_EVENT], provider);
  await contract.on("Transfer", (from, to, value, payload) => transfer(payload.log));
  return async () => {
    await contract.removeAllListeners();
    await provider.destroy();
  };
}

async function viemWatch() {
  const viem = require(path.join(modules, "viem"));
  const chain = viem.defineChain({
    id: 1337,
    name: "devnet",
    nativeCurrency: { name: "Ether", symbol: "ETH", decimals: 18 },
    rpcUrls: { default: { http: [httpUrl], webSocket: [wsUrl] } },
  });
  const transport = mode === "viem-http" ? viem.http(httpUrl) : viem.webSocket(wsUrl);
  const client = viem.createPublicClient({ chain, transport, pollingInterval: POLL_MS });
  const onError = (error) => out({ error: String(error && error.message ? error.message : error) });
  let unwatch;
  if (mode === "viem-blocks") {
    unwatch = client.watchBlocks({
      onBlock: (block) => out({ block: Number(block.number), hash: block.hash }),
      onError,
    });
  } else {
    unwatch = client.watchContractEvent({
      address: token,
      abi: [viem.parseAbiItem(ABI_EVENT)],
      eventName: "Transfer",
      onLogs: (logs) => logs.forEach(transfer),
      onError,
    });
  }
  return async () => unwatch();
}

async function main() {
  const stop = mode.startsWith("ethers") ? await ethersWatch() : await viemWatch();
  // Let the subscription or first filter poll reach the proxy before saying ready.
  await new Promise((resolve) => setTimeout(resolve, 3 * POLL_MS));
  out({ ready: true });
  process.stdin.resume();
  process.stdin.on("end", async () => {
    await stop();
    out({ done: true });
    process.exit(0);
  });
}

main().catch((error) => {
  out({ error: String(error && error.stack ? error.stack : error) });
  process.exit(1);
});
