// Conformance program for pgjdbc through weir in transaction mode.
//
// prepareThreshold=1 makes pgjdbc use named server-side statements (S_N) from
// the first run; preparedStatementCacheQueries=10 makes it close old ones.
// Reads WEIR_HOST, WEIR_PORT, WEIR_DB, WEIR_USER, WEIR_PASSWORD; exits 0
// when every check passed.

import java.io.StringReader;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.sql.Types;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.TimeUnit;

import org.postgresql.PGConnection;

public class Conformance {
    static final int CLIENTS = Integer.parseInt(System.getenv().getOrDefault("WEIR_CLIENTS", "20"));

    static Connection connect() throws SQLException {
        String url = "jdbc:postgresql://" + System.getenv("WEIR_HOST") + ":" + System.getenv("WEIR_PORT") + "/"
                + System.getenv("WEIR_DB");
        Properties p = new Properties();
        p.setProperty("user", System.getenv("WEIR_USER"));
        p.setProperty("password", System.getenv("WEIR_PASSWORD"));
        p.setProperty("prepareThreshold", "1");
        p.setProperty("preparedStatementCacheQueries", "10");
        return DriverManager.getConnection(url, p);
    }

    static void check(boolean ok, String what) {
        if (!ok) throw new AssertionError(what);
    }

    static int one(PreparedStatement ps) throws SQLException {
        try (ResultSet rs = ps.executeQuery()) {
            check(rs.next(), "no row");
            return rs.getInt(1);
        }
    }

    static void expectState(PreparedStatement ps, String state, String what) {
        try {
            ps.execute();
        } catch (SQLException e) {
            check(state.equals(e.getSQLState()), what + ": got " + e.getSQLState() + " " + e.getMessage());
            return;
        }
        throw new AssertionError(what + ": no error");
    }

    static void worker(int i) throws Exception {
        try (Connection c = connect()) {
            // Prepared queries reused across many transactions.
            try (PreparedStatement twice = c.prepareStatement("select ?::int * 2")) {
                for (int k = 0; k < 30; k++) {
                    twice.setInt(1, k);
                    int got = one(twice);
                    check(got == 2 * k, "reuse: " + k + "*2 gave " + got);
                }
            }
            // More distinct statements than max_prepared_statements and the cache.
            for (int j = 0; j < 40; j++) {
                try (PreparedStatement ps = c.prepareStatement("select ?::int + " + j)) {
                    ps.setInt(1, i);
                    int got = one(ps);
                    check(got == i + j, "distinct " + j + " gave " + got);
                }
            }
            // Commit and rollback.
            String insert = "insert into drv_jdbc (id, note) values (?, ?)";
            c.setAutoCommit(false);
            for (int r = 1; r <= 2; r++) {
                try (PreparedStatement ps = c.prepareStatement(insert)) {
                    ps.setInt(1, i * 1000 + r);
                    ps.setString(2, "tx");
                    ps.executeUpdate();
                }
                if (r == 1) c.commit(); else c.rollback();
            }
            c.setAutoCommit(true);
            try (PreparedStatement ps = c.prepareStatement("select count(*) from drv_jdbc where id = any(?)")) {
                ps.setArray(1, c.createArrayOf("int4", new Integer[] {i * 1000 + 1, i * 1000 + 2}));
                int n = one(ps);
                check(n == 1, "commit/rollback left " + n + " rows");
            }
            // An error inside a transaction, then recovery.
            c.setAutoCommit(false);
            try (PreparedStatement div = c.prepareStatement("select 1 / ?::int");
                 PreparedStatement sel = c.prepareStatement("select 1")) {
                div.setInt(1, 0);
                expectState(div, "22012", "division by zero");
                expectState(sel, "25P02", "aborted transaction");
            }
            c.rollback();
            c.setAutoCommit(true);
            // NULLs and binary parameters.
            byte[] blob = {0, 1, 2, (byte) 255, 0, 127};
            try (PreparedStatement ps = c.prepareStatement("select ?::bytea, ?::text, ?::int4")) {
                ps.setBytes(1, blob);
                ps.setNull(2, Types.VARCHAR);
                ps.setNull(3, Types.INTEGER);
                try (ResultSet rs = ps.executeQuery()) {
                    check(rs.next(), "no row");
                    check(Arrays.equals(rs.getBytes(1), blob), "bytea round trip");
                    check(rs.getString(2) == null, "null text");
                    rs.getInt(3);
                    check(rs.wasNull(), "null int");
                }
            }
            // COPY.
            StringBuilder rows = new StringBuilder();
            for (int r = 0; r < 10; r++) rows.append(i * 1000 + 100 + r).append("\t\\N\n");
            long copied = c.unwrap(PGConnection.class).getCopyAPI()
                    .copyIn("copy drv_jdbc (id, note) from stdin", new StringReader(rows.toString()));
            check(copied == 10, "copy wrote " + copied);
            // A statement timeout through the driver's own API (pgjdbc cancels it).
            if (i % 5 == 0) {
                try (PreparedStatement ps = c.prepareStatement("select pg_sleep(5)")) {
                    ps.setQueryTimeout(1);
                    expectState(ps, "57014", "query timeout");
                }
                try (PreparedStatement ps = c.prepareStatement("select ?::int * 2")) {
                    ps.setInt(1, 21);
                    check(one(ps) == 42, "after timeout");
                }
            }
        }
    }

    public static void main(String[] args) throws Exception {
        try (Connection c = connect(); Statement s = c.createStatement()) {
            s.execute("drop table if exists drv_jdbc");
            s.execute("create table drv_jdbc (id int primary key, note text)");
        }
        List<String> failures = Collections.synchronizedList(new ArrayList<>());
        List<Thread> threads = new ArrayList<>();
        for (int i = 0; i < CLIENTS; i++) {
            final int id = i;
            Thread t = new Thread(() -> {
                try {
                    worker(id);
                } catch (Throwable e) {
                    failures.add("client " + id + ": " + e);
                }
            });
            t.start();
            threads.add(t);
        }
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(120);
        for (Thread t : threads) t.join(Math.max(1, TimeUnit.NANOSECONDS.toMillis(deadline - System.nanoTime())));
        for (Thread t : threads) if (t.isAlive()) failures.add("a client did not finish within 120 s");
        try (Connection c = connect(); Statement s = c.createStatement(); ResultSet rs = s.executeQuery("select count(*) from drv_jdbc")) {
            rs.next();
            if (rs.getInt(1) != CLIENTS * 11) failures.add("total rows " + rs.getInt(1));
        }
        for (String f : failures) System.out.println("FAIL: " + f);
        if (!failures.isEmpty()) System.exit(1);
        System.out.println("pgjdbc " + org.postgresql.util.DriverInfo.DRIVER_VERSION + ": " + CLIENTS + " clients passed");
        System.exit(0);
    }
}
