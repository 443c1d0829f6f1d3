import java.io.File;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.avro.Schema;
import org.apache.avro.SchemaNormalization;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.message.BinaryMessageDecoder;
import org.apache.avro.message.BinaryMessageEncoder;

/**
 * faultrouter's wire format as a Java team sees it: the schemas of avro/ loaded
 * with Java Avro's own parser, fingerprints from SchemaNormalization, records
 * written and read with the standard single-object encoder and decoder
 * (BinaryMessageEncoder, BinaryMessageDecoder). Run by integration tests:
 *
 *   WireCheck fingerprints AVRO_DIR         one line per schema file: file, full name, fingerprint (hex)
 *   WireCheck canonical                     stdin: one schema per line; stdout: its fingerprint (hex) and Parsing Canonical Form
 *   WireCheck encode AVRO_DIR OUT TASK EVENT  a TaskEvent (a network timeout) in the single-object encoding, to OUT
 *   WireCheck decode AVRO_DIR IN            a RoutedRecord from IN, printed as JSON
 */
public final class WireCheck {
  public static void main(String[] args) throws Exception {
    switch (args.length > 0 ? args[0] : "") {
      case "fingerprints" -> fingerprints(new File(args[1]));
      case "canonical" -> canonical();
      case "encode" -> encode(new File(args[1]), Path.of(args[2]), args[3], args[4]);
      case "decode" -> decode(new File(args[1]), Path.of(args[2]));
      default -> {
        System.err.println("usage: WireCheck fingerprints|canonical|encode|decode ...");
        System.exit(2);
      }
    }
  }

  /**
   * Loads avro/ the way docs/workers.md tells a Java user to: the shared named types
   * (class.avsc, task_event.avsc) first, into one parser, then the records that
   * reference them. Frozen history files are complete and get their own parser.
   */
  static Map<String, Schema> load(File dir) throws IOException {
    Schema.Parser parser = new Schema.Parser();
    Map<String, Schema> out = new HashMap<>();
    for (String f : List.of("class.avsc", "task_event.avsc", "routed_record.avsc", "breaker_event.avsc",
        "review_decision.avsc", "task_state.avsc")) {
      out.put(f, parser.parse(new File(dir, f)));
    }
    File[] history = new File(dir, "history").listFiles((d, n) -> n.endsWith(".avsc"));
    if (history != null) {
      for (File h : history) {
        out.put("history/" + h.getName(), new Schema.Parser().parse(h));
      }
    }
    return out;
  }

  static void fingerprints(File dir) throws IOException {
    for (Map.Entry<String, Schema> e : load(dir).entrySet()) {
      if (e.getValue().getType() != Schema.Type.RECORD) {
        continue;
      }
      long fp = SchemaNormalization.parsingFingerprint64(e.getValue());
      System.out.printf("%s\t%s\t%016x%n", e.getKey(), e.getValue().getFullName(), fp);
    }
  }

  static void canonical() throws IOException {
    java.io.BufferedReader in = new java.io.BufferedReader(new java.io.InputStreamReader(System.in));
    for (String line; (line = in.readLine()) != null;) {
      if (line.isBlank()) {
        continue;
      }
      Schema s = new Schema.Parser().parse(line);
      System.out.printf("%016x\t%s%n", SchemaNormalization.parsingFingerprint64(s), SchemaNormalization.toParsingForm(s));
    }
  }

  static void encode(File dir, Path out, String taskId, String eventId) throws IOException {
    Schema schema = load(dir).get("task_event.avsc");
    GenericRecord e = timeoutEvent(schema, taskId, eventId, "java-avro");
    ByteBuffer buf = new BinaryMessageEncoder<GenericRecord>(GenericData.get(), schema).encode(e);
    byte[] b = new byte[buf.remaining()];
    buf.get(b);
    Files.write(out, b);
  }

  /** A TaskEvent of a network timeout on its first attempt; attributes.client names the writer. */
  static GenericRecord timeoutEvent(Schema schema, String taskId, String eventId, String client) {
    GenericRecord error = new GenericData.Record(schema.getField("error").schema().getTypes().get(1));
    error.put("type", "TimeoutError");
    error.put("http_status", 504);
    GenericRecord usage = new GenericData.Record(schema.getField("usage").schema());
    usage.put("cost_usd", 0.002);
    usage.put("tokens", 120L);
    usage.put("elapsed_ms", 3000L);
    GenericRecord e = new GenericData.Record(schema);
    e.put("event_id", eventId);
    e.put("task_id", taskId);
    e.put("attempt", 1);
    e.put("occurred_at", System.currentTimeMillis());
    e.put("source", "java-worker");
    e.put("action", "summarize");
    e.put("provider", "openai");
    e.put("model", "gpt-4o");
    e.put("stage", new GenericData.EnumSymbol(schema.getField("stage").schema().getTypes().get(1), "NETWORK"));
    e.put("status", new GenericData.EnumSymbol(schema.getField("status").schema(), "ERROR"));
    e.put("error", error);
    e.put("usage", usage);
    e.put("attributes", Map.of("client", client));
    // GenericData.Record leaves unset nullable fields null, as the schema's defaults say.
    return e;
  }

  static void decode(File dir, Path in) throws IOException {
    Map<String, Schema> all = load(dir);
    BinaryMessageDecoder<GenericRecord> dec = new BinaryMessageDecoder<>(GenericData.get(), all.get("routed_record.avsc"));
    // the router writes version 2 for a decision no override made: the decoder resolves
    // the earlier versions (history/) into the current schema
    for (Map.Entry<String, Schema> e : all.entrySet()) {
      if (e.getKey().startsWith("history/routed_record.")) {
        dec.addSchema(e.getValue());
      }
    }
    GenericRecord r = dec.decode(Files.readAllBytes(in));
    System.out.println(GenericData.get().toString(r));
  }
}
