// Conformance program for pgx v4 through weir in transaction mode.
//
// Built offline in GOPATH mode against Debian's golang-github-jackc-pgx-v4-dev
// (GO111MODULE=off GOPATH=/usr/share/gocode). Reads WEIR_URL; exits 0 when
// every check passed. pgx prepares every query under its own name and, with
// statement_cache_capacity=10, sends `deallocate <name>` as SQL on eviction.
package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgconn"
	"github.com/jackc/pgx/v4"
)

const clients = 20

func connect(ctx context.Context) (*pgx.Conn, error) {
	return pgx.Connect(ctx, os.Getenv("WEIR_URL")+"?statement_cache_capacity=10")
}

func check(cond bool, format string, args ...interface{}) error {
	if !cond {
		return fmt.Errorf(format, args...)
	}
	return nil
}

func sqlstate(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

func worker(ctx context.Context, id int) error {
	conn, err := connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	// Prepared queries reused across many transactions.
	for k := 0; k < 30; k++ {
		var got int
		if err := conn.QueryRow(ctx, "select $1::int * 2", k).Scan(&got); err != nil {
			return err
		}
		if err := check(got == 2*k, "reuse: %d*2 gave %d", k, got); err != nil {
			return err
		}
	}
	// Many distinct statements: more than max_prepared_statements and than pgx's cache.
	for j := 0; j < 40; j++ {
		var got int
		if err := conn.QueryRow(ctx, fmt.Sprintf("select $1::int + %d", j), id).Scan(&got); err != nil {
			return fmt.Errorf("distinct %d: %w", j, err)
		}
		if err := check(got == id+j, "distinct %d gave %d", j, got); err != nil {
			return err
		}
	}
	// Commit and rollback.
	for _, c := range []struct {
		row    int
		commit bool
	}{{id*1000 + 1, true}, {id*1000 + 2, false}} {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "insert into drv_pgx (id, note) values ($1, $2)", c.row, "tx"); err != nil {
			return err
		}
		if c.commit {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			return err
		}
	}
	var n int
	if err := conn.QueryRow(ctx, "select count(*) from drv_pgx where id = any($1)", []int{id*1000 + 1, id*1000 + 2}).Scan(&n); err != nil {
		return err
	}
	if err := check(n == 1, "commit/rollback left %d rows", n); err != nil {
		return err
	}
	// An error inside a transaction, then recovery.
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, "select 1 / $1::int", 0)
	if err := check(sqlstate(err) == "22012", "division by zero gave %v", err); err != nil {
		return err
	}
	_, err = tx.Exec(ctx, "select 1")
	if err := check(sqlstate(err) == "25P02", "aborted transaction gave %v", err); err != nil {
		return err
	}
	if err := tx.Rollback(ctx); err != nil {
		return err
	}
	// NULLs and binary parameters.
	blob := []byte{0, 1, 2, 0xff, 0, 0x7f}
	var gotBlob []byte
	var gotText *string
	var gotInt *int32
	if err := conn.QueryRow(ctx, "select $1::bytea, $2::text, $3::int4", blob, nil, nil).Scan(&gotBlob, &gotText, &gotInt); err != nil {
		return err
	}
	if err := check(bytes.Equal(gotBlob, blob) && gotText == nil && gotInt == nil, "nulls/binary: %v %v %v", gotBlob, gotText, gotInt); err != nil {
		return err
	}
	// COPY.
	rows := [][]interface{}{}
	for r := 0; r < 10; r++ {
		rows = append(rows, []interface{}{id*1000 + 100 + r, nil})
	}
	copied, err := conn.CopyFrom(ctx, pgx.Identifier{"drv_pgx"}, []string{"id", "note"}, pgx.CopyFromRows(rows))
	if err != nil {
		return fmt.Errorf("copy: %w", err)
	}
	if err := check(copied == 10, "copy wrote %d rows", copied); err != nil {
		return err
	}
	// A statement cancelled through the driver's own API (a context deadline).
	if id%5 == 0 {
		tctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err := conn.Exec(tctx, "select pg_sleep(5)")
		cancel()
		// pgx v4 sets a past deadline on the socket when the context expires, so
		// the query fails with the context's own error (pgconn's errTimeout wraps it).
		if err := check(errors.Is(err, context.DeadlineExceeded), "pg_sleep(5) past a 300ms deadline gave %v, not context.DeadlineExceeded", err); err != nil {
			return err
		}
		// pgx v4 closes a connection whose context expired mid-query.
		conn2, err := connect(ctx)
		if err != nil {
			return err
		}
		defer conn2.Close(ctx)
		var one int
		if err := conn2.QueryRow(ctx, "select $1::int * 2", 21).Scan(&one); err != nil || one != 42 {
			return fmt.Errorf("after cancel: %v %d", err, one)
		}
	}
	return nil
}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	setup, err := connect(ctx)
	if err != nil {
		fmt.Println("connect:", err)
		os.Exit(1)
	}
	for _, q := range []string{"drop table if exists drv_pgx", "create table drv_pgx (id int primary key, note text)"} {
		if _, err := setup.Exec(ctx, q); err != nil {
			fmt.Println("setup:", err)
			os.Exit(1)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func(id int) {
			defer wg.Done()
			if err := worker(ctx, id); err != nil {
				errs <- fmt.Errorf("client %d: %w", id, err)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	failed := 0
	for err := range errs {
		fmt.Println("FAIL:", err)
		failed++
	}
	var total int
	if err := setup.QueryRow(ctx, "select count(*) from drv_pgx").Scan(&total); err != nil || total != clients*11 {
		fmt.Println("FAIL: total rows", total, err)
		failed++
	}
	if failed > 0 {
		os.Exit(1)
	}
	fmt.Printf("pgx v4: %d clients passed\n", clients)
}
