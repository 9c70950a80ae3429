// Preloaded into the Portkey gateway (node --require): its server listens on every
// interface and has no option for the address, so force 127.0.0.1 for the benchmarks.
const net = require('net');
const orig = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (typeof args[0] === 'number' || (typeof args[0] === 'string' && /^\d+$/.test(args[0]))) {
    const port = Number(args[0]);
    const rest = args.slice(1).filter((a) => typeof a === 'function');
    return orig.call(this, { port, host: '127.0.0.1' }, ...rest);
  }
  if (args[0] && typeof args[0] === 'object' && !args[0].host && args[0].port !== undefined) {
    args[0] = Object.assign({}, args[0], { host: '127.0.0.1' });
  }
  return orig.apply(this, args);
};
