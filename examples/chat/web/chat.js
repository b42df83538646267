// The chat page: Courier's JavaScript client over WebSocket, no build
// step. Rooms are the pub-sub exchanges "room.<name>" (keys "msg" and
// "typing"), presence comes from their member events, lines go through
// the service ("chat.say"), history comes from "chat.history", direct
// messages are requests to "user.<name>", which each page handles for
// its own user.
import { connect, Code } from '/js/courier.js';

const $ = (id) => document.getElementById(id);
const NAME = /^[A-Za-z0-9_-]{1,32}$/;
const TYPING_EVERY_MS = 2000; // at most one typing publish per 2 s
const TYPING_SHOWN_MS = 3000; // how long "x is typing" stays

const state = {
  conn: null, user: '', rooms: [], room: '', sub: null, here: null,
  members: new Map(), // member id -> user, in the current room
  seen: new Set(),    // lines shown in the current room
  typing: new Map(),  // user -> timer
  lastTyping: 0,
};
// For tests and curious developers.
window.chat = { state, ready: false, events: [] };

function status(text) { $('status').textContent = text; }

// lineKey identifies a line, to show it once when it arrives both live
// and in the history.
const lineKey = (l) => `${l.from}\u0000${l.ts}\u0000${l.text}`;

function showLine(l, history) {
  const k = lineKey(l);
  if (state.seen.has(k)) return;
  state.seen.add(k);
  const li = document.createElement('li');
  li.className = history ? 'line history' : 'line';
  li.dataset.from = l.from;
  const from = document.createElement('span');
  from.className = 'from';
  from.textContent = l.from;
  const text = document.createElement('span');
  text.className = 'text';
  text.textContent = l.text;
  li.title = new Date(l.ts).toLocaleString();
  li.append(from, text);
  $('messages').append(li);
  li.scrollIntoView({ block: 'end' });
}

function showPresence() {
  const users = [...new Set(state.members.values())].sort();
  $('presence').replaceChildren(...users.map((u) => {
    const li = document.createElement('li');
    li.textContent = u;
    return li;
  }));
}

function showTyping() {
  const who = [...state.typing.keys()].filter((u) => u !== state.user).sort();
  $('typing').textContent = who.length ? `${who.join(', ')} ${who.length > 1 ? 'are' : 'is'} typing…` : '';
}

// onEvent follows the group of the room's presence exchange, where each
// page in the room is a handler: the first event (leader) lists it
// whole, then member-up and member-down change it.
function onEvent(ev) {
  window.chat.events.push(ev);
  const person = (m) => m && m.role === 'handler' && m.conn_tag;
  if (ev.kind === 'leader' && ev.members) {
    state.members.clear();
    for (const m of ev.members) if (person(m)) state.members.set(m.id, m.conn_tag);
  } else if (ev.kind === 'member-up' && person(ev.member)) {
    state.members.set(ev.member.id, ev.member.conn_tag);
  } else if (ev.kind === 'member-down' && ev.member) {
    state.members.delete(ev.member.id);
  }
  showPresence();
}

function onMessage(m) {
  let l;
  try { l = m.json(); } catch { return; }
  if (!l || typeof l.from !== 'string' || typeof l.text !== 'string') return;
  if (m.key === 'msg') {
    showLine(l, false);
    clearTimeout(state.typing.get(l.from));
    state.typing.delete(l.from);
  } else if (m.key === 'typing') {
    clearTimeout(state.typing.get(l.from));
    state.typing.set(l.from, setTimeout(() => { state.typing.delete(l.from); showTyping(); }, TYPING_SHOWN_MS));
  }
  showTyping();
}

// join subscribes to a room (the moderator may refuse), shows its
// history (lines that arrive meanwhile are shown once), then enters its
// presence group.
async function join(room) {
  for (const a of [state.here, state.sub]) if (a) await a.detach().catch(() => {});
  state.here = state.sub = null;
  state.room = room;
  localStorage.setItem('chat.room', room);
  state.members.clear(); state.seen.clear(); state.typing.clear();
  $('messages').replaceChildren(); showPresence(); showTyping();
  $('room').textContent = `#${room}`;
  for (const b of $('rooms').querySelectorAll('button')) b.classList.toggle('current', b.dataset.room === room);
  try {
    state.sub = await state.conn.subscribe(`room.${room}`, ['msg', 'typing'], onMessage, { connTag: state.user });
  } catch (err) {
    status(`cannot join #${room}: ${err.message}`);
    window.chat.refused = err.message;
    return;
  }
  const resp = await state.conn.request('chat.history', room, { timeoutMs: 5000 });
  for (const l of resp.json()) showLine(l, true);
  state.here = await state.conn.handle(`presence.${room}`, () => state.user, { connTag: state.user, onEvent });
  status('');
}

// say sends a line to the service (chat.say, keyed by the room), which
// keeps it in the room's history and publishes it to the room.
async function say(text) {
  const line = { from: state.user, text, ts: Date.now() };
  await state.conn.publish('chat.say', state.room, JSON.stringify(line), { confirm: true });
}

// typing publishes the indicator: fire and forget, never stored.
function typing() {
  const now = Date.now();
  if (now - state.lastTyping < TYPING_EVERY_MS || !state.room) return;
  state.lastTyping = now;
  state.conn.publish(`room.${state.room}`, 'typing', JSON.stringify({ from: state.user, text: '', ts: now })).catch(() => {});
}

function showDM(from, to, text) {
  const li = document.createElement('li');
  li.className = 'dm';
  const who = document.createElement('span');
  who.className = 'from';
  who.textContent = from === state.user ? `→ ${to}` : from;
  const t = document.createElement('span');
  t.textContent = text;
  li.append(who, t);
  $('dms').append(li);
}

// sendDM is a request to the recipient's own exchange: it resolves when
// their page has shown it, and fails at once when nobody is there.
async function sendDM(to, text) {
  const line = { from: state.user, text, ts: Date.now() };
  try {
    await state.conn.request(`user.${to}`, JSON.stringify(line), { timeoutMs: 5000 });
    showDM(state.user, to, text);
  } catch (err) {
    const gone = err.code === Code.NO_HANDLER || err.code === Code.NOT_FOUND;
    status(gone ? `${to} is offline` : `DM to ${to}: ${err.message}`);
  }
}

async function start(user) {
  state.user = user;
  $('me').textContent = user;
  const cfg = await (await fetch('/config.json')).json();
  state.rooms = cfg.rooms;
  state.conn = await connect(cfg.ws, { name: `chat-${user}` });
  state.conn.ondisconnect = (err) => status(`disconnected: ${err.message}`);
  state.conn.onreconnect = () => status('');
  await state.conn.declare(`user.${user}`, { pattern: 'reqresp', strategy: 'round-robin' });
  await state.conn.handle(`user.${user}`, (req) => {
    const l = req.json();
    if (!l || typeof l.from !== 'string' || typeof l.text !== 'string') throw new Error('not a chat line');
    showDM(l.from, user, l.text);
    return 'shown';
  }, { connTag: user });
  $('rooms').replaceChildren(...state.rooms.map((r) => {
    const li = document.createElement('li');
    const b = document.createElement('button');
    b.dataset.room = r;
    b.textContent = `#${r}`;
    b.onclick = () => join(r);
    li.append(b);
    return li;
  }));
  $('app').hidden = false;
  const saved = localStorage.getItem('chat.room');
  await join(state.rooms.includes(saved) ? saved : state.rooms[0]);
  window.chat.ready = true;
}

$('say').onsubmit = (e) => {
  e.preventDefault();
  const text = $('text').value.trim();
  if (!text) return;
  $('text').value = '';
  say(text).catch((err) => status(`not sent: ${err.message}`));
};
$('text').oninput = typing;
$('dm').onsubmit = (e) => {
  e.preventDefault();
  const to = $('dm-to').value.trim(), text = $('dm-text').value.trim();
  if (!NAME.test(to) || !text) return;
  $('dm-text').value = '';
  sendDM(to, text);
};

// The user: ?user= (saved), else the saved one, else the login form.
const asked = new URLSearchParams(location.search).get('user');
if (asked && NAME.test(asked)) localStorage.setItem('chat.user', asked);
const user = localStorage.getItem('chat.user');
if (user && NAME.test(user)) {
  start(user).catch((err) => { status(`cannot start: ${err.message}`); window.chat.error = err.message; });
} else {
  $('login').hidden = false;
  $('login').onsubmit = (e) => {
    e.preventDefault();
    const name = $('login-name').value.trim();
    if (!NAME.test(name)) return;
    localStorage.setItem('chat.user', name);
    $('login').hidden = true;
    start(name).catch((err) => status(`cannot start: ${err.message}`));
  };
}
