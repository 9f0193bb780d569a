// Registers N job schedulers the way `bench fire` registers N Metronome tasks: scheduler
// b<i> fires every INTERVAL_MS from T0 + i * INTERVAL_MS / N (the same spread grid).
// Usage: node register.mjs REDIS_URL N INTERVAL_MS T0_MS
import { Queue } from 'bullmq';

const [url, n, intervalMs, t0] = process.argv.slice(2);
const N = Number(n), every = Number(intervalMs), start = Number(t0);
const queue = new Queue('bench', { connection: { url } });
const CHUNK = 1000;
for (let first = 0; first < N; first += CHUNK) {
  const calls = [];
  for (let i = first; i < Math.min(N, first + CHUNK); i++) {
    calls.push(queue.upsertJobScheduler(
      `b${i}`,
      { every, startDate: start + Math.floor((i * every) / N) },
      // what a production user sets: finished jobs are not kept forever
      { name: 'fire', data: {}, opts: { removeOnComplete: true, removeOnFail: 1000 } },
    ));
  }
  await Promise.all(calls);
}
await queue.close();
