// A JDBC client for tests/test_pgwire_clients.py: run as `java -cp postgresql.jar DpsqlJdbc.java URL USER PASSWORD`.
// Prints one line per fact the Python test checks; every query goes through a PreparedStatement
// that is described before it is executed (getMetaData), then executed twice (a repeat).
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.ParameterMetaData;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.ResultSetMetaData;
import java.sql.SQLException;
import java.sql.Statement;

public class DpsqlJdbc {
    static final String GROUPED = "SELECT region, COUNT(*) AS n, AVG(income) AS avg_income, COUNT(*) > 100 AS big, "
        + "DATE '2024-01-02' AS day, NULL AS nothing FROM visits WHERE age > ? GROUP BY region";

    public static void main(String[] args) throws Exception {
        try (Connection conn = DriverManager.getConnection(args[0], args[1], args[2])) {
            try (Statement s = conn.createStatement()) {
                s.execute("SET dpsql.epsilon = 0.25");
            }
            try (PreparedStatement p = conn.prepareStatement(GROUPED)) {
                ResultSetMetaData meta = p.getMetaData();  // Parse + Describe, before any value is bound
                StringBuilder columns = new StringBuilder("columns");
                for (int i = 1; i <= meta.getColumnCount(); i++) {
                    columns.append(' ').append(meta.getColumnName(i)).append(':').append(meta.getColumnTypeName(i));
                }
                System.out.println(columns);
                ParameterMetaData params = p.getParameterMetaData();
                System.out.println("parameters " + params.getParameterCount() + " " + params.getParameterTypeName(1));
                System.out.println("spent " + spent(conn));
                for (int run = 0; run < 3; run++) {  // the third runs a server-side named statement
                    p.setInt(1, 30);
                    StringBuilder rows = new StringBuilder("rows");
                    try (ResultSet rs = p.executeQuery()) {
                        while (rs.next()) {
                            rows.append(' ').append(rs.getString("region")).append('|').append(rs.getLong("n"))
                                .append('|').append(rs.getDouble("avg_income")).append('|').append(rs.getBoolean("big"))
                                .append('|').append(rs.getDate("day")).append('|').append(rs.getObject("nothing"));
                        }
                    }
                    System.out.println(rows);
                }
            }
            System.out.println("spent " + spent(conn));
            refused(conn, "SELECT ssn FROM visits WHERE age > ?");
            refused(conn, "SELECT COUNT(*) AS n FROM visits WHERE age > ? /* dpsql: epsilon=0.9 */");
            System.out.println("spent " + spent(conn));
        }
    }

    static double spent(Connection conn) throws SQLException {
        try (Statement s = conn.createStatement(); ResultSet rs = s.executeQuery("SHOW dpsql.budget")) {
            rs.next();
            return rs.getDouble("epsilon_spent");
        }
    }

    static void refused(Connection conn, String sql) throws SQLException {
        try (PreparedStatement p = conn.prepareStatement(sql)) {
            p.setInt(1, 1);
            p.executeQuery().close();
            System.out.println("answered " + sql);
        } catch (SQLException e) {
            System.out.println("error " + e.getSQLState() + " " + e.getMessage().replace('\n', ' '));
        }
    }
}
