// Request-response rate of the JavaScript client over WebSocket:
// sequential, then `parallel` requests in flight, each for `seconds`.
// Usage: node [--experimental-websocket] bench/reqresp.js ws://127.0.0.1:7480/ws exchange [seconds] [parallel]
// Prints one JSON line: {"sequential": req/s, "parallel": req/s}.
import { connect } from '../courier.js';

const [url, exchange, secs = '3', par = '100'] = process.argv.slice(2);
const ms = Number(secs) * 1000;
const body = new Uint8Array(16);

async function run(conn, inflight) {
  let n = 0;
  const end = Date.now() + ms;
  const start = Date.now();
  await Promise.all(Array.from({ length: inflight }, async () => {
    while (Date.now() < end) {
      await conn.request(exchange, body);
      n++;
    }
  }));
  return n / ((Date.now() - start) / 1000);
}

const conn = await connect(url, { name: 'bench' });
const sequential = await run(conn, 1);
const parallel = await run(conn, Number(par));
conn.close();
console.log(JSON.stringify({ sequential: Math.round(sequential), parallel: Math.round(parallel) }));
