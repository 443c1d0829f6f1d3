import java.io.File;
import java.util.Map;
import java.util.Properties;

import org.apache.avro.Schema;
import org.apache.avro.generic.GenericRecord;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.StringSerializer;

import io.apicurio.registry.serde.avro.AvroKafkaSerializer;
import io.apicurio.registry.serde.config.SerdeConfig;

/**
 * A Java worker on a schema registry: a KafkaProducer whose value serializer is
 * Apicurio Registry's AvroKafkaSerializer (from Maven Central), which registers
 * the TaskEvent schema of avro/ under the topic's subject (TopicIdStrategy:
 * <topic>-value) and writes the Confluent wire format: the byte 0, the 4-byte
 * schema ID, the Avro body. Run by the integration tests:
 *
 *   RegistryProduce BROKERS REGISTRY_API_URL AVRO_DIR TOPIC TASK EVENT
 *
 * REGISTRY_API_URL is Apicurio's native API (.../apis/registry/v3).
 */
public final class RegistryProduce {
  public static void main(String[] args) throws Exception {
    if (args.length != 6) {
      System.err.println("usage: RegistryProduce BROKERS REGISTRY_API_URL AVRO_DIR TOPIC TASK EVENT");
      System.exit(2);
    }
    Schema schema = WireCheck.load(new File(args[2])).get("task_event.avsc");
    GenericRecord e = WireCheck.timeoutEvent(schema, args[4], args[5], "java-apicurio-serde");
    Properties p = new Properties();
    p.put("bootstrap.servers", args[0]);
    p.put("enable.idempotence", "true");
    p.put("key.serializer", StringSerializer.class.getName());
    p.put("value.serializer", AvroKafkaSerializer.class.getName());
    p.putAll(Map.of(SerdeConfig.REGISTRY_URL, args[1], SerdeConfig.AUTO_REGISTER_ARTIFACT, "true"));
    try (KafkaProducer<String, GenericRecord> producer = new KafkaProducer<>(p)) {
      producer.send(new ProducerRecord<>(args[3], args[4], e)).get();
    }
    System.out.println("sent " + args[4]);
  }
}
