// GenOffsets writes the Kafka Connect offset files that the tests of package
// debezium read. It writes them exactly as Kafka Connect's
// FileOffsetBackingStore.save does (Kafka 3.9): a java.util.HashMap<byte[],
// byte[]> of the JSON key and value bytes, written with one
// ObjectOutputStream.writeObject. A null value is an offset that was reset.
//
// Run from this directory with the JDK only (Java 11 or later):
//
//	java GenOffsets.java
//
// The keys and values are the JSON that Kafka Connect's JsonConverter (with
// schemas disabled, as Connect uses it for offsets) makes of Debezium's
// partition and offset maps.
import java.io.ObjectOutputStream;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.Map;

public class GenOffsets {
    static byte[] b(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    static byte[] key(String connector, String server) {
        return b("[\"" + connector + "\",{\"server\":\"" + server + "\"}]");
    }

    static void write(String file, Object obj) throws Exception {
        try (OutputStream out = Files.newOutputStream(Path.of(file));
             ObjectOutputStream os = new ObjectOutputStream(out)) {
            os.writeObject(obj);
        }
    }

    public static void main(String[] args) throws Exception {
        // One connector that stopped in the middle of a transaction: its last
        // delivered record was an INSERT of transaction 771.
        Map<byte[], byte[]> one = new HashMap<>();
        one.put(key("outbox-connector", "dbserver1"),
                b("{\"transaction_id\":null,\"lsn_proc\":24023128,\"messageType\":\"INSERT\",\"lsn_commit\":24022784,"
                        + "\"lsn\":24023128,\"txId\":771,\"ts_usec\":1718000000123456}"));
        write("offsets-one.dat", one);

        // A standalone worker's file with several connectors.
        Map<byte[], byte[]> many = new HashMap<>();
        // At a transaction boundary (a heartbeat after COMMIT).
        many.put(key("outbox-a", "app"),
                b("{\"lsn_proc\":33554600,\"messageType\":\"COMMIT\",\"lsn_commit\":33554600,\"lsn\":33554600,"
                        + "\"txId\":900,\"ts_usec\":1718000001000000}"));
        // Mid-transaction, with several events at one LSN and transaction metadata.
        many.put(key("outbox-b", "billing"),
                b("{\"transaction_id\":\"1204:4294967296\",\"transaction_data_collection_order_public.outbox\":3,"
                        + "\"lsn_proc\":4294967400,\"messageType\":\"INSERT\",\"lsn_commit\":4294967296,"
                        + "\"lsn\":4294967400,\"txId\":1204,\"ts_usec\":1718000002000000,\"lsn_events_processed\":2,"
                        + "\"xmin\":1200}"));
        // An initial snapshot that did not finish.
        many.put(key("outbox-snap", "snap"),
                b("{\"last_snapshot_record\":false,\"lsn\":22000000,\"txId\":500,\"ts_usec\":1718000003000000,"
                        + "\"snapshot\":\"INITIAL\",\"snapshot_completed\":false}"));
        // A MySQL connector of the same worker: not ours.
        many.put(key("mysql-conn", "mysql1"),
                b("{\"file\":\"binlog.000003\",\"pos\":1234,\"ts_sec\":1718000004}"));
        // An offset reset with the REST API leaves a null value.
        many.put(key("outbox-reset", "gone"), null);
        write("offsets-many.dat", many);

        // Enough entries to resize the map, and one value array written twice
        // (the second time as a back reference to the same object).
        Map<byte[], byte[]> large = new HashMap<>();
        byte[] shared = b("{\"lsn_proc\":1000,\"messageType\":\"COMMIT\",\"lsn_commit\":1000,\"lsn\":1000,\"txId\":7,\"ts_usec\":1}");
        for (int i = 0; i < 100; i++) {
            String name = String.format("conn-%03d", i);
            if (i < 2) {
                large.put(key(name, "shared"), shared);
                continue;
            }
            large.put(key(name, "s" + i),
                    b("{\"lsn_proc\":" + (1000 + i) + ",\"messageType\":\"COMMIT\",\"lsn_commit\":" + (1000 + i)
                            + ",\"lsn\":" + (1000 + i) + ",\"txId\":" + i + ",\"ts_usec\":" + i + "}"));
        }
        write("offsets-large.dat", large);

        write("offsets-empty.dat", new HashMap<byte[], byte[]>());

        // Not offset files: a map of strings, and a list.
        Map<String, String> strings = new HashMap<>();
        strings.put("[\"c\",{\"server\":\"s\"}]", "{\"lsn\":1}");
        write("not-offsets-strings.dat", strings);
        ArrayList<byte[]> list = new ArrayList<>();
        list.add(b("x"));
        write("not-offsets-list.dat", list);
    }
}
