// Conformance program for node-postgres (pg) through weir in transaction mode.
//
// Named queries ({ name, text, values }) make pg prepare each statement once
// per connection under that name and reuse it. pg itself has no COPY (that
// takes the separate pg-copy-streams package), so COPY is not exercised here.
// Reads WEIR_URL; exits 0 when every check passed.
'use strict';

const { Client } = require('pg');

const URL = process.env.WEIR_URL;
const CLIENTS = Number(process.env.WEIR_CLIENTS || 20);

function check(ok, what) {
  if (!ok) throw new Error(what);
}

async function expectCode(promise, code, what) {
  try {
    await promise;
  } catch (e) {
    check(e.code === code, `${what}: got ${e.code} ${e.message}`);
    return;
  }
  throw new Error(`${what}: no error`);
}

async function connect(extra = {}) {
  const c = new Client({ connectionString: URL, ...extra });
  await c.connect();
  return c;
}

async function worker(i) {
  const c = await connect();
  try {
    // Prepared (named) queries reused across many transactions.
    for (let k = 0; k < 30; k++) {
      const r = await c.query({ name: 'twice', text: 'select $1::int * 2 as v', values: [k] });
      check(r.rows[0].v === 2 * k, `reuse: ${k}*2 gave ${r.rows[0].v}`);
    }
    // More distinct statements than max_prepared_statements.
    for (let j = 0; j < 40; j++) {
      const r = await c.query({ name: `plus_${j}`, text: `select $1::int + ${j} as v`, values: [i] });
      check(r.rows[0].v === i + j, `distinct ${j} gave ${r.rows[0].v}`);
    }
    // Commit and rollback.
    const insert = (id) => ({ name: 'ins', text: 'insert into drv_node (id, note) values ($1, $2)', values: [id, 'tx'] });
    await c.query('begin');
    await c.query(insert(i * 1000 + 1));
    await c.query('commit');
    await c.query('begin');
    await c.query(insert(i * 1000 + 2));
    await c.query('rollback');
    const n = await c.query({ name: 'count', text: 'select count(*)::int as n from drv_node where id = any($1)', values: [[i * 1000 + 1, i * 1000 + 2]] });
    check(n.rows[0].n === 1, `commit/rollback left ${n.rows[0].n} rows`);
    // An error inside a transaction, then recovery.
    await c.query('begin');
    await expectCode(c.query({ name: 'div', text: 'select 1 / $1::int', values: [0] }), '22012', 'division by zero');
    await expectCode(c.query({ name: 'twice', text: 'select $1::int * 2 as v', values: [1] }), '25P02', 'aborted transaction');
    await c.query('rollback');
    const again = await c.query({ name: 'twice', text: 'select $1::int * 2 as v', values: [21] });
    check(again.rows[0].v === 42, 'recovery');
    // NULLs and binary parameters (a Buffer goes as a binary parameter).
    const blob = Buffer.from([0, 1, 2, 255, 0, 127]);
    const row = (await c.query({ name: 'nulls', text: 'select $1::bytea as b, $2::text as t, $3::int4 as n', values: [blob, null, null] })).rows[0];
    check(Buffer.isBuffer(row.b) && row.b.equals(blob) && row.t === null && row.n === null, `nulls/binary: ${JSON.stringify(row)}`);
    // Rows for the final count (COPY stands in pg-copy-streams' place).
    for (let r = 0; r < 10; r++) await c.query(insert(i * 1000 + 100 + r));
    // A statement timeout through the driver's own setting.
    if (i % 5 === 0) {
      const t = await connect({ statement_timeout: 300 });
      try {
        await expectCode(t.query({ name: 'sleep', text: 'select pg_sleep($1)', values: [5] }), '57014', 'statement_timeout');
        const r = await t.query({ name: 'twice', text: 'select $1::int * 2 as v', values: [21] });
        check(r.rows[0].v === 42, 'after timeout');
      } finally {
        await t.end();
      }
    }
  } finally {
    await c.end();
  }
}

async function main() {
  const setup = await connect();
  await setup.query('drop table if exists drv_node');
  await setup.query('create table drv_node (id int primary key, note text)');
  const results = await Promise.allSettled(Array.from({ length: CLIENTS }, (_, i) => worker(i)));
  const failures = results.flatMap((r, i) => (r.status === 'rejected' ? [`client ${i}: ${r.reason && r.reason.stack}`] : []));
  const total = (await setup.query('select count(*)::int as n from drv_node')).rows[0].n;
  if (total !== CLIENTS * 11) failures.push(`total rows ${total}`);
  await setup.end();
  for (const f of failures) console.log('FAIL:', f);
  if (failures.length) process.exit(1);
  console.log(`node-postgres ${require('pg/package.json').version}: ${CLIENTS} clients passed`);
}

const guard = setTimeout(() => {
  console.log('FAIL: no result within 120 s');
  process.exit(1);
}, 120000);
main().then(() => clearTimeout(guard), (e) => {
  console.log('FAIL:', e && e.stack);
  process.exit(1);
});
