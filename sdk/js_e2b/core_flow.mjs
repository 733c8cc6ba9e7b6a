// The official E2B JavaScript SDK's core flow, unchanged, against Warren's
// E2B door: test/e2e's TestE2BJSSDK runs it with E2B_API_URL,
// E2B_SANDBOX_URL, E2B_API_KEY and WARREN_E2B_TEMPLATE set (watchDir and
// getMetrics included). Prints
// "JS SDK OK" at the end; any failed check throws.
import { Sandbox, CommandExitError } from 'e2b'
const t = process.env.WARREN_E2B_TEMPLATE || 'bb'
const sbx = await Sandbox.create(t, { timeoutMs: 120_000, metadata: { js: '1' } })
try {
  const r = await sbx.commands.run('echo hi; echo err >&2', { envs: { A: '1' }, cwd: '/tmp' })
  if (r.stdout !== 'hi\n' || r.stderr !== 'err\n') throw new Error('run ' + JSON.stringify(r))
  try { await sbx.commands.run('exit 5'); throw new Error('no raise') } catch (e) { if (!(e instanceof CommandExitError) || e.exitCode !== 5) throw e }
  const bg = await sbx.commands.run('sleep 100', { background: true })
  if (!(await sbx.commands.list()).some(p => p.pid === bg.pid)) throw new Error('list')
  await bg.kill()
  await sbx.files.write('/tmp/d/x.txt', 'js-data')
  if ((await sbx.files.read('/tmp/d/x.txt')) !== 'js-data') throw new Error('read')
  const bin = new Uint8Array(300000).map((_, i) => i % 251)
  await sbx.files.write('/tmp/b.bin', bin.buffer)
  const back = await sbx.files.read('/tmp/b.bin', { format: 'bytes' })
  if (back.length !== bin.length || back.some((v, i) => v !== bin[i])) throw new Error('binary')
  if (!(await sbx.files.exists('/tmp/d/x.txt'))) throw new Error('exists')
  await sbx.files.makeDir('/tmp/d/sub')
  const names = (await sbx.files.list('/tmp/d')).map(e => e.name).sort()
  if (names.join(',') !== 'sub,x.txt') throw new Error('list ' + names)
  await sbx.files.rename('/tmp/d/x.txt', '/tmp/d/y.txt')
  await sbx.files.remove('/tmp/d/sub')
  // watchDir (envd's WatchDir stream) sees a command's changes, recursive
  // into a directory made after the watch started.
  const seen = new Set()
  const watch = await sbx.files.watchDir('/tmp/d', ev => { seen.add(ev.name + ':' + ev.type) }, { recursive: true })
  const waitSeen = async (want) => {
    for (const deadline = Date.now() + 60_000; !want.every(k => seen.has(k));) {
      if (Date.now() > deadline) throw new Error('watchDir saw ' + [...seen] + ', want ' + want)
      await new Promise(r => setTimeout(r, 100))
    }
  }
  // The new directory first: its watch is in place once its create is
  // reported (a file made and removed within microseconds of the mkdir,
  // before inotify watches the directory, is not seen: as with envd).
  await sbx.commands.run('mkdir -p /tmp/d/w')
  await waitSeen(['w:create'])
  await sbx.commands.run('echo 1 > /tmp/d/w/f && rm /tmp/d/w/f')
  await waitSeen(['w/f:create', 'w/f:write', 'w/f:remove'])
  await watch.stop()
  const [m] = await sbx.getMetrics()
  if (!m || !(m.cpuCount >= 1) || !(m.memUsed > 0 && m.memUsed <= m.memTotal) || !(m.diskUsed > 0)) throw new Error('getMetrics ' + JSON.stringify(m))
  const found = await Sandbox.list({ query: { metadata: { js: '1' } } }).nextItems()
  if (!found.some(s => s.sandboxId === sbx.sandboxId)) throw new Error('Sandbox.list')
  await sbx.setTimeout(60_000)
  await sbx.pause()
  const again = await Sandbox.connect(sbx.sandboxId)
  if ((await again.files.read('/tmp/d/y.txt')) !== 'js-data') throw new Error('after connect')
  console.log('JS SDK OK')
} finally {
  await sbx.kill()
}
