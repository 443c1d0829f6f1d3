import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.common.utils.Utils;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.StoreBuilder;
import org.apache.kafka.streams.state.Stores;

/**
 * The Kafka Streams peer of faultrouter's benchmark: the application a user
 * would write instead of adopting the router, doing comparable state work on
 * the same backlog, tuned as its users would tune it: exactly_once_v2, one
 * stream thread per core (--threads), the commit interval of the router
 * (--commit-interval-ms) and a persistent (RocksDB) key-value store with a
 * changelog topic behind Streams' record cache (--cache-bytes). For each input record it
 * gets the task's state by the record key, updates it (attempts, routed
 * count, first and last timestamps) and puts it back (through Streams' record
 * cache, so one changelog record per task per commit),
 * writes an audit record (the input value followed by the new state and the
 * decision) and, for a deterministic share of the records, a routed record
 * (the input value followed by the decision). It does not decode Avro: the
 * value is opaque bytes.
 *
 * <p>With --warmup-records=N it first runs the same application under the
 * application id ID-warmup on the first N records of the backlog (N/P of
 * each of its P partitions) and closes it, so that the measured application
 * runs on code the JIT has compiled, as a long-running application does.
 *
 * <p>Records at or beyond the backlog's end offsets (--ends) are consumed
 * but not processed, so that the peer does exactly the backlog's work even
 * when more records follow it in the topic.
 *
 * <p>Usage: java StreamsPeer --bootstrap=HOST:PORT --application-id=ID
 * --input=TOPIC --audit=TOPIC --routed=TOPIC --state-dir=DIR
 * --routed-percent=45 --max-poll-records=N --fetch-max-bytes=N
 * --batch-bytes=N --retry-backoff-ms=N --ends=P:OFFSET,... [--warmup-records=N]
 * [--threads=N] [--commit-interval-ms=N] [--cache-bytes=N]
 *
 * <p>It prints "running" when the application first reaches RUNNING. When its
 * standard input ends (or on SIGTERM) it closes the application, prints
 * "processed=N routed=M skipped=K" and exits.
 */
public final class StreamsPeer {
	static final String STORE = "task-state";

	static final AtomicLong processed = new AtomicLong();
	static final AtomicLong routed = new AtomicLong();
	static final AtomicLong skipped = new AtomicLong();
	static volatile boolean failed;

	public static void main(String[] argv) throws Exception {
		Map<String, String> a = new HashMap<>();
		for (String s : argv) {
			int eq = s.indexOf('=');
			if (!s.startsWith("--") || eq < 0) {
				throw new IllegalArgumentException("want --name=value, got " + s);
			}
			a.put(s.substring(2, eq), s.substring(eq + 1));
		}
		Map<Integer, Long> ends = new HashMap<>();
		for (String pe : need(a, "ends").split(",")) {
			String[] kv = pe.split(":");
			ends.put(Integer.parseInt(kv[0]), Long.parseLong(kv[1]));
		}
		CountDownLatch stop = new CountDownLatch(1);
		CountDownLatch closed = new CountDownLatch(1);
		Runtime.getRuntime().addShutdownHook(new Thread(() -> {
			stop.countDown();
			try {
				closed.await();
			} catch (InterruptedException e) {
				Thread.currentThread().interrupt();
			}
		}));
		Thread stdin = new Thread(() -> {
			try {
				System.in.transferTo(java.io.OutputStream.nullOutputStream());
			} catch (java.io.IOException e) {
				// ended either way
			}
			stop.countDown();
		}, "stdin");
		stdin.setDaemon(true);
		stdin.start();

		// warm-up: the same work on the first --warmup-records of the backlog,
		// under its own application id, so that the measured application
		// runs on compiled code, as a long-running one would
		long warm = Long.parseLong(a.getOrDefault("warmup-records", "0"));
		if (warm > 0) {
			Map<Integer, Long> warmEnds = new HashMap<>();
			long target = 0;
			for (var e : ends.entrySet()) {
				long w = Math.min(e.getValue(), warm / ends.size());
				warmEnds.put(e.getKey(), w);
				target += w;
			}
			KafkaStreams ws = build(a, need(a, "application-id") + "-warmup", warmEnds, stop, null);
			ws.start();
			long began = System.currentTimeMillis();
			while (processed.get() < target && stop.getCount() > 0) {
				Thread.sleep(50);
			}
			ws.close(Duration.ofSeconds(30));
			System.err.printf("warm-up: %d records in %d ms%n", processed.get(), System.currentTimeMillis() - began);
			processed.set(0);
			routed.set(0);
			skipped.set(0);
		}

		KafkaStreams streams = build(a, need(a, "application-id"), ends, stop, "running");
		if (stop.getCount() > 0) {
			streams.start();
			stop.await();
		}
		streams.close(Duration.ofSeconds(30));
		say("processed=" + processed.get() + " routed=" + routed.get() + " skipped=" + skipped.get());
		closed.countDown();
		if (failed) {
			System.err.println("streams-peer: the application stopped in ERROR");
			System.exit(1);
		}
	}

	/**
	 * build returns the application under appId, processing the records
	 * below ends; it prints running (when not null) on reaching RUNNING, and
	 * counts stop down when it fails.
	 */
	static KafkaStreams build(Map<String, String> a, String appId, Map<Integer, Long> ends, CountDownLatch stop, String running) {
		Properties p = new Properties();
		p.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
		p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, need(a, "bootstrap"));
		p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
		// what a user tunes: a stream thread per core, the commit interval
		// (exactly_once_v2 defaults to 100 ms) and the record cache's size
		p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, Integer.parseInt(a.getOrDefault("threads", "1")));
		p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, Long.parseLong(a.getOrDefault("commit-interval-ms", "100")));
		p.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, Long.parseLong(a.getOrDefault("cache-bytes", String.valueOf(10L << 20))));
		p.put(StreamsConfig.STATE_DIR_CONFIG, need(a, "state-dir"));
		p.put(StreamsConfig.consumerPrefix(ConsumerConfig.MAX_POLL_RECORDS_CONFIG), need(a, "max-poll-records"));
		p.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
		// the router's own client settings, where Streams has them
		p.put(StreamsConfig.consumerPrefix(ConsumerConfig.FETCH_MAX_BYTES_CONFIG), need(a, "fetch-max-bytes"));
		p.put(StreamsConfig.producerPrefix(ProducerConfig.BATCH_SIZE_CONFIG), need(a, "batch-bytes"));
		p.put(StreamsConfig.RETRY_BACKOFF_MS_CONFIG, need(a, "retry-backoff-ms"));

		StoreBuilder<KeyValueStore<Bytes, byte[]>> store = Stores.keyValueStoreBuilder(
				Stores.persistentKeyValueStore(STORE), Serdes.Bytes(), Serdes.ByteArray())
				.withLoggingEnabled(Map.of()) // the default, said out loud: a changelog topic
				// Streams' record cache: one changelog record per task per commit, as the
				// router writes one state record per task per transaction
				.withCachingEnabled();

		int routedPercent = Integer.parseInt(need(a, "routed-percent"));
		Topology t = new Topology();
		t.addSource("ingress", new ByteArrayDeserializer(), new ByteArrayDeserializer(), need(a, "input"));
		t.addProcessor("route", () -> new Route(routedPercent, ends), "ingress");
		t.addStateStore(store, "route");
		t.addSink("audit", need(a, "audit"), new ByteArraySerializer(), new ByteArraySerializer(), "route");
		t.addSink("routed", need(a, "routed"), new ByteArraySerializer(), new ByteArraySerializer(), "route");

		KafkaStreams streams = new KafkaStreams(t, p);
		streams.setStateListener((now, before) -> {
			if (running != null && now == KafkaStreams.State.RUNNING && before == KafkaStreams.State.REBALANCING) {
				say(running);
			}
			if (now == KafkaStreams.State.ERROR || now == KafkaStreams.State.PENDING_ERROR) {
				failed = true;
				stop.countDown();
			}
		});
		streams.setUncaughtExceptionHandler(e -> {
			System.err.println("streams-peer: " + e);
			e.printStackTrace();
			return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
		});
		return streams;
	}

	static synchronized void say(String line) {
		System.out.println(line);
		System.out.flush();
	}

	static String need(Map<String, String> a, String name) {
		String v = a.get(name);
		if (v == null) {
			throw new IllegalArgumentException("missing --" + name);
		}
		return v;
	}

	/**
	 * The per-record work: get, update and put the task's state, write the
	 * audit record and, for routedPercent of the records, a routed record.
	 */
	static final class Route implements Processor<byte[], byte[], byte[], byte[]> {
		// attempts, routed (ints), first and last record timestamps (longs)
		static final int STATE_SIZE = 4 + 4 + 8 + 8;

		final int routedPercent;
		final Map<Integer, Long> ends;
		ProcessorContext<byte[], byte[]> ctx;
		KeyValueStore<Bytes, byte[]> store;

		Route(int routedPercent, Map<Integer, Long> ends) {
			this.routedPercent = routedPercent;
			this.ends = ends;
		}

		@Override
		public void init(ProcessorContext<byte[], byte[]> ctx) {
			this.ctx = ctx;
			this.store = ctx.getStateStore(STORE);
		}

		@Override
		public void process(Record<byte[], byte[]> r) {
			var md = ctx.recordMetadata().orElseThrow();
			Long end = ends.get(md.partition());
			if (end == null || md.offset() >= end) {
				skipped.incrementAndGet();
				return;
			}
			byte[] key = r.key() == null ? new byte[0] : r.key();
			Bytes k = Bytes.wrap(key);
			byte[] old = store.get(k);
			int attempts = 0, routedCount = 0;
			long first = r.timestamp();
			if (old != null) {
				ByteBuffer b = ByteBuffer.wrap(old);
				attempts = b.getInt();
				routedCount = b.getInt();
				first = b.getLong();
			}
			attempts++;
			// deterministic and spread over tasks and attempts: murmur2 of the
			// key (Kafka's partitioner hash) mixed with the attempt number
			boolean route = Math.floorMod(Utils.murmur2(key) ^ (attempts * 0x9E3779B9), 100) < routedPercent;
			if (route) {
				routedCount++;
			}
			byte[] state = ByteBuffer.allocate(STATE_SIZE)
					.putInt(attempts).putInt(routedCount).putLong(first).putLong(r.timestamp()).array();
			store.put(k, state);

			byte[] v = r.value() == null ? new byte[0] : r.value();
			byte decision = (byte) (route ? 1 : 0);
			ByteBuffer audit = ByteBuffer.allocate(v.length + STATE_SIZE + 1).put(v).put(state).put(decision);
			ctx.forward(r.withValue(audit.array()), "audit");
			if (route) {
				ByteBuffer out = ByteBuffer.allocate(v.length + 1).put(v).put(decision);
				ctx.forward(r.withValue(out.array()), "routed");
				routed.incrementAndGet();
			}
			if (processed.incrementAndGet() % 10_000 == 0) { // progress in its log, to see the warm-up
				System.err.printf("processed %d at %d ms%n", processed.get(), System.currentTimeMillis());
			}
		}
	}
}
