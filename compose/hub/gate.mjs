#!/usr/bin/env node
// The portal's one public address: configurable-http-proxy, used as a library, with a gate on request bodies.
//
// daphne holds a whole request body in memory before the portal sees it, so nothing larger than the portal
// takes may reach it. A body that declares a larger length is refused (413) before a byte of it is read (and
// before "100 Continue"); one sent in chunks is counted as it streams and refused the moment it passes its
// limit: the proxy stops forwarding it and closes the connection. Limits, from portal/entrylimits.py:
//   to the portal, without a session cookie          --anonymous-body-bytes
//   to the portal, with one                          --portal-body-bytes (--upload-body-bytes on --upload-path)
//   to whatever else the proxy routes (JupyterHub)   --jupyter-body-bytes
// A route is the portal's when its target is the default target, so /jupyter/ falls back to the portal's
// limits while the hub's routes are missing. At most --portal-bodies-at-once bodies over the anonymous limit
// travel to the portal at once; one more is answered 503 with Retry-After. A session that begins more than
// --upload-starts-per-window scene uploads (POST --upload-path) in a window of --upload-window-seconds gets 429
// here, before each costs daphne a request (the portal counts the same per person, and stays the rule).
// Started by compose/hub/proxy.py (make run) and by JupyterHub (tests), with the arguments they pass to
// configurable-http-proxy; any other argument stops it with a message.

import { parseArgs } from "node:util";
import { ConfigurableProxy } from "configurable-http-proxy";
import { defaultLogger } from "configurable-http-proxy/lib/log.js";

const LIMITS = {
  "anonymous-body-bytes": "anonymous",
  "portal-body-bytes": "portal",
  "upload-body-bytes": "upload",
  "jupyter-body-bytes": "jupyter",
  "portal-bodies-at-once": "atOnce",
  "upload-starts-per-window": "uploadStarts",
  "upload-window-seconds": "uploadWindow",
};
const MOST_COUNTED = 100000; // session cookies counted in one window; past it the count starts again

function bytesInWords(count) {
  const units = [["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]];
  const [unit, size] = units.find(([, size]) => count >= size) || ["bytes", 1];
  return `${Math.round((10 * count) / size) / 10} ${unit}`;
}

export class GatedProxy extends ConfigurableProxy {
  constructor(options, gate) {
    super(options);
    this.gate = gate;
    this.portalTarget = new URL(options.defaultTarget).href;
    this.portalBodies = 0;
    this.starts = new Map(); // session cookie -> upload starts in this window
    this.startsWindow = 0;
    this.upstreams = new WeakMap(); // request -> its request to the target, to stop when a body is refused
    this.proxy.on("proxyReq", (upstream, req) => {
      if (req.gateRefused) upstream.destroy();
      else this.upstreams.set(req, upstream);
    });
    // With a listener here Node no longer answers "100 Continue" by itself: the gate decides first.
    this.proxyServer.on("checkContinue", (req, res) => this.handleProxyWeb(req, res, true));
  }

  async handleProxyWeb(req, res, expectsContinue = false) {
    const wait = this.uploadStartWait(req);
    if (wait) {
      const minutes = Math.round(this.gate.uploadWindow / 60);
      const words = `Too many uploads begun: at most ${this.gate.uploadStarts} in ${minutes} minutes; try again in ${wait} seconds.`;
      return this.refuse(req, res, 429, words, { "Retry-After": String(wait) });
    }
    const hasBody = req.headers["transfer-encoding"] !== undefined || Number(req.headers["content-length"]) > 0;
    if (!hasBody) {
      if (expectsContinue) res.writeContinue();
      return super.handleProxyWeb(req, res);
    }
    req.pause(); // nothing of the body moves until the gate has decided
    let match;
    try {
      match = await this.targetForReq(req);
    } catch {
      return super.handleProxyWeb(req, res); // a path it cannot read: configurable-http-proxy answers it
    }
    const toPortal = !match || new URL(match.target).href === this.portalTarget;
    const limit = this.limitFor(req, toPortal);
    const declared = Number(req.headers["content-length"] || 0);
    if (declared > limit) return this.refuse(req, res, 413, this.tooLarge(limit));
    if (toPortal && (declared > this.gate.anonymous || !declared) && !this.takeSlot(res)) {
      return this.refuse(req, res, 503, "Too many large requests are arriving at once; try again in a moment.", {
        "Retry-After": "1",
      });
    }
    let seen = 0;
    req.on("data", (chunk) => {
      seen += chunk.length;
      if (seen > limit) this.refuseMidway(req, res, limit);
    });
    delete req.headers.expect; // answered here, or by Node: the target must not wait to answer it again
    if (expectsContinue) res.writeContinue();
    return super.handleProxyWeb(req, res);
  }

  // Seconds until this session may begin another upload; 0 when it may now. Counted in fixed windows, as the
  // portal counts them, per session cookie (the entry knows no person).
  uploadStartWait(req) {
    const path = (req.url || "").split("?")[0];
    const session = this.sessionCookie(req);
    if (req.method !== "POST" || path !== this.gate.uploadPath || !session) return 0;
    const now = Date.now() / 1000;
    const window = Math.floor(now / this.gate.uploadWindow);
    if (window !== this.startsWindow || this.starts.size >= MOST_COUNTED) {
      this.startsWindow = window;
      this.starts = new Map();
    }
    const count = (this.starts.get(session) || 0) + 1;
    this.starts.set(session, count);
    if (count <= this.gate.uploadStarts) return 0;
    return Math.max(1, Math.ceil((window + 1) * this.gate.uploadWindow - now));
  }

  limitFor(req, toPortal) {
    if (!toPortal) return this.gate.jupyter;
    if (!this.hasSessionCookie(req)) return this.gate.anonymous;
    const path = (req.url || "").split("?")[0];
    return path.startsWith(this.gate.uploadPath) ? this.gate.upload : this.gate.portal;
  }

  sessionCookie(req) {
    const prefix = `${this.gate.sessionCookie}=`;
    const found = (req.headers.cookie || "").split(";").map((part) => part.trim()).find((c) => c.startsWith(prefix));
    return found ? found.slice(prefix.length) : "";
  }

  hasSessionCookie(req) {
    return this.sessionCookie(req) !== "";
  }

  takeSlot(res) {
    if (this.portalBodies >= this.gate.atOnce) return false;
    this.portalBodies += 1;
    res.once("close", () => {
      this.portalBodies -= 1;
    });
    return true;
  }

  tooLarge(limit) {
    return `The request is too large: this address takes at most ${bytesInWords(limit)} in one request here.`;
  }

  refuseMidway(req, res, limit) {
    if (req.gateRefused) return;
    req.unpipe();
    const upstream = this.upstreams.get(req);
    if (upstream) upstream.destroy();
    this.refuse(req, res, 413, this.tooLarge(limit));
  }

  refuse(req, res, status, words, headers = {}) {
    req.gateRefused = true;
    const note = status === 429 ? this.log.info : this.log.warn; // a flood of 429s must not flood the log too
    note.call(this.log, "%s %s %s refused: %s", status, req.method, (req.url || "").split("?")[0], words);
    if (res.headersSent) {
      req.socket.destroy();
      return;
    }
    const body = words + "\n";
    res.writeHead(status, {
      "Content-Type": "text/plain; charset=utf-8",
      "Content-Length": Buffer.byteLength(body),
      Connection: "close", // the rest of the body is never read: the connection closes once this is sent
      ...headers,
    });
    res.end(body);
  }

  handleProxyError(code, kind, req, res, error) {
    if (req.gateRefused) return; // its target was cut off on purpose: the refusal is the answer
    return super.handleProxyError(code, kind, req, res, error);
  }
}

function options() {
  const spec = {
    ip: { type: "string", default: "" },
    port: { type: "string", default: "8000" },
    "api-ip": { type: "string", default: "localhost" },
    "api-port": { type: "string" },
    "default-target": { type: "string" },
    "error-target": { type: "string" },
    "log-level": { type: "string", default: "info" },
    "upload-path": { type: "string" },
    "session-cookie": { type: "string" },
  };
  for (const name of Object.keys(LIMITS)) spec[name] = { type: "string" };
  const { values } = parseArgs({ options: spec, strict: true });
  const gate = { uploadPath: values["upload-path"], sessionCookie: values["session-cookie"] };
  for (const [name, key] of Object.entries(LIMITS)) {
    gate[key] = Number(values[name]);
    if (!Number.isInteger(gate[key]) || gate[key] < 1) throw new Error(`--${name} must be a whole number above 0`);
  }
  for (const name of ["default-target", "upload-path", "session-cookie"]) {
    if (!values[name]) throw new Error(`--${name} is required`);
  }
  return { values, gate };
}

function main() {
  let parsed;
  try {
    parsed = options();
  } catch (error) {
    console.error(`gate: ${error.message}`);
    process.exit(2);
  }
  const { values, gate } = parsed;
  const log = defaultLogger({ level: values["log-level"].toLowerCase() });
  const proxy = new GatedProxy(
    {
      log,
      defaultTarget: values["default-target"],
      errorTarget: values["error-target"],
      authToken: process.env.CONFIGPROXY_AUTH_TOKEN,
      xfwd: true,
      prependPath: true,
      includePrefix: true,
    },
    gate,
  );
  const apiPort = Number(values["api-port"] || Number(values.port) + 1);
  proxy.proxyServer.listen(Number(values.port), values.ip);
  proxy.apiServer.listen(apiPort, values["api-ip"]);
  log.info("Proxying %s:%s to %s, API on %s:%s", values.ip, values.port, values["default-target"], values["api-ip"], apiPort);
  for (const signal of ["SIGINT", "SIGTERM"]) process.on(signal, () => process.exit(2));
  process.on("uncaughtException", (error) => log.error("Uncaught exception: %s", error.stack || error.message));
}

main();
