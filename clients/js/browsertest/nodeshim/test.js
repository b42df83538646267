// node:test in a browser, for the JavaScript client's Node.js suite
// (clients/js/test) to run unchanged in Chromium (browsertest/node.html):
// test() registers, run() runs the registered tests one after another.
const registered = [];

/** test registers a test, as node:test's does (no options, no subtests). */
export function test(name, fn) {
  registered.push({ name, fn });
}

/**
 * run runs the tests registered so far, in order, and calls report(name,
 * error) after each (error null when it passed); it resolves to the
 * number that failed.
 */
export async function run(report) {
  let failed = 0;
  for (const { name, fn } of registered.splice(0)) {
    try {
      await fn();
      report(name, null);
    } catch (err) {
      failed++;
      report(name, err);
    }
  }
  return failed;
}

export default test;
