// One BullMQ worker process: a no-op processor that records when it started each fire,
// `scheduler_id due_ms start_ms` per line in OUT_DIR/fires-<pid>.txt (as bench.handlers
// does for Metronome), so `bench fire`'s analysis reads both alike.
// Usage: node worker.mjs REDIS_URL CONCURRENCY OUT_DIR
import { appendFileSync } from 'node:fs';
import { Worker } from 'bullmq';

const [url, concurrency, outDir] = process.argv.slice(2);
const out = `${outDir}/fires-${process.pid}.txt`;
let lines = [];
const flush = () => {
  if (lines.length) appendFileSync(out, lines.join(''));
  lines = [];
};
const worker = new Worker(
  'bench',
  async (job) => {
    // a scheduler's job id is repeat:<scheduler id>:<due ms>
    const [, id, due] = job.id.split(':');
    lines.push(`${id} ${due} ${Date.now()}\n`);
  },
  { connection: { url }, concurrency: Number(concurrency) },
);
const timer = setInterval(flush, 1000);
process.on('SIGTERM', async () => {
  clearInterval(timer);
  await worker.close();
  flush();
  process.exit(0);
});
