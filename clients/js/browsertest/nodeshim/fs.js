// node:fs in a browser: readFileSync of a path the page's server serves
// (the suite reads the Go codec's frames, COURIER_GOLDEN, with it), by a
// synchronous request, as a module's top level needs.
export function readFileSync(path) {
  const xhr = new XMLHttpRequest();
  xhr.open('GET', path, false);
  xhr.send();
  if (xhr.status !== 200) throw new Error(`readFileSync ${path}: HTTP ${xhr.status}`);
  return xhr.responseText;
}

export default { readFileSync };
