// Runs the Node.js suite (clients/js/test/*.test.js, named in the
// page's ?files= query) in the browser, on the node: shims of node.html;
// the result lands in window.__result ("PASS n", or "FAIL: ..."), which
// the Go test (TestChromiumNodeSuite) polls.
import { run } from 'node:test';

const log = (s) => { document.getElementById('log').textContent += s + '\n'; };
const files = (new URLSearchParams(location.search).get('files') ?? '').split(',').filter(Boolean);

(async () => {
  try {
    if (files.length === 0) throw new Error('no test files given (?files=)');
    for (const f of files) await import(`../test/${f}`);
    let passed = 0;
    const failed = await run((name, err) => {
      if (err) log(`✖ ${name}: ${err.message}`);
      else { passed++; log(`✔ ${name}`); }
    });
    window.__result = failed === 0 ? `PASS ${passed}` : `FAIL: ${failed} of ${passed + failed} tests failed`;
  } catch (err) {
    log(`FAIL ${err.message}`);
    window.__result = `FAIL: ${err.message}`;
  }
})();
