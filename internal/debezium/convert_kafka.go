package debezium

import (
	"regexp"
	"strings"
)

// converterKind classifies a Kafka Connect converter class.
func converterKind(class string) string {
	switch class {
	case "org.apache.kafka.connect.storage.StringConverter":
		return "string"
	case "org.apache.kafka.connect.json.JsonConverter":
		return "json"
	case "org.apache.kafka.connect.converters.ByteArrayConverter",
		"io.debezium.converters.ByteArrayConverter",
		"io.debezium.converters.BinaryDataConverter":
		return "bytes"
	}
	return ""
}

// effective returns the converter the connector's records went through for
// key.converter or value.converter: the connector's own, else the worker's,
// with the same configuration's schemas.enable.
func (c *converter) effective(which string) (key, class, schemas string, ok bool) {
	if v, has := c.get(which); has && v != "" {
		s, _ := c.get(which + ".schemas.enable")
		return which, v, s, true
	}
	if v := strings.TrimSpace(c.worker[which]); v != "" {
		return which, v, strings.TrimSpace(c.worker[which+".schemas.enable"]), true
	}
	return which, "", "", false
}

func (c *converter) converters() {
	kinds := make(map[string]string)
	classes := make(map[string]string)
	ok := true
	for _, which := range []string{"key.converter", "value.converter"} {
		key, class, schemas, found := c.effective(which)
		for k := range c.conn {
			if strings.HasPrefix(k, which+".") {
				c.used[k] = true
			}
		}
		if !found {
			c.gap(which, "", "not set in the connector's configuration or the worker's: set message.converter to string (StringConverter) or json (JsonConverter without schemas) as consumers expect")
			ok = false
			continue
		}
		kind := converterKind(class)
		switch {
		case kind == "":
			c.gap(key, class, "the relay writes keys and values as StringConverter (message.converter string) or schemaless JsonConverter (json) do; this converter's format is not reproduced: consumers must change to one of those")
			ok = false
		case kind == "json" && !strings.EqualFold(schemas, "false"):
			c.gap(key+".schemas.enable", schemas, "JsonConverter with schemas enabled (Kafka's default) wraps each %s in a {\"schema\", \"payload\"} envelope; the relay writes the schemaless form (message.converter json): consumers reading the envelope must change", strings.TrimSuffix(which, ".converter"))
		case kind == "bytes" && which == "key.converter":
			c.gap(key, class, "a byte-array key converter cannot write Debezium's string key, so this connector did not work as configured: choose StringConverter or JsonConverter")
			ok = false
		}
		kinds[which], classes[which] = kind, class
	}
	if ok {
		switch k, v := kinds["key.converter"], kinds["value.converter"]; {
		case k == v:
			c.set("message.converter", k, "key.converter, value.converter")
		case k == "string" && v == "bytes":
			c.set("message.converter", "string", "key.converter, value.converter")
			c.note("value.converter", classes["value.converter"], "a byte-array value converter writes a bytea payload's bytes as they are, as message.converter string does")
		default:
			c.gap("value.converter", classes["value.converter"], "key.converter is %s and value.converter is %s; the relay uses one converter for both (message.converter): set string or json, whichever consumers of the values need, and check the keys", classes["key.converter"], classes["value.converter"])
		}
	}
	hc := strings.TrimSpace(c.conn["header.converter"])
	if hc == "" {
		hc = strings.TrimSpace(c.worker["header.converter"])
	}
	c.used["header.converter"] = true
	switch hc {
	case "", "org.apache.kafka.connect.storage.SimpleHeaderConverter", "org.apache.kafka.connect.storage.StringConverter":
	default:
		c.gap("header.converter", hc, "the relay writes header values as Kafka Connect's SimpleHeaderConverter does (the default); this converter's format is not reproduced")
	}
	for k := range c.conn {
		if strings.HasPrefix(k, "header.converter.") {
			c.used[k] = true
		}
	}
}

// producerValue returns a producer setting as Kafka Connect applies it to the
// connector's producer: the connector's producer.override.<name>, else the
// worker's producer.<name>, else the worker's <name> (which configures the
// worker's own clients; used as a hint when the producer's is not set).
func (c *converter) producerValue(name string) (key, value string, ok bool) {
	if v, has := c.get("producer.override." + name); has {
		return "producer.override." + name, v, true
	}
	for _, k := range []string{"producer." + name, name} {
		if v, has := c.worker[k]; has {
			return k, strings.TrimSpace(v), true
		}
	}
	return "", "", false
}

// jaasUsername reads username="..." from a sasl.jaas.config value.
var jaasUsername = regexp.MustCompile(`username\s*=\s*"([^"]*)"`)

func (c *converter) kafka() {
	if key, v, ok := c.producerValue("bootstrap.servers"); ok && v != "" {
		if c.literal(key, v, "kafka.brokers") {
			var bs []string
			for b := range strings.SplitSeq(v, ",") {
				if b = strings.TrimSpace(b); b != "" {
					bs = append(bs, b)
				}
			}
			c.set("kafka.brokers", strings.Join(bs, ","), key)
		}
	} else if c.worker == nil {
		c.gap("bootstrap.servers", "", "the brokers are in the worker's configuration, which was not given: set kafka.brokers")
	} else {
		c.gap("bootstrap.servers", "", "not set in the worker's configuration: set kafka.brokers")
	}
	if key, v, ok := c.producerValue("compression.type"); ok {
		switch strings.ToLower(v) {
		case "none", "":
		case "gzip", "snappy", "lz4", "zstd":
			c.set("kafka.compression", strings.ToLower(v), key)
		default:
			c.gap(key, v, "not a compression the relay knows: set kafka.compression to none, gzip, snappy, lz4 or zstd")
		}
	}
	protoKey, proto, _ := c.producerValue("security.protocol")
	proto = strings.ToUpper(proto)
	switch proto {
	case "", "PLAINTEXT":
		return
	case "SSL", "SASL_SSL":
		c.set("kafka.tls.enabled", "true", protoKey)
		c.tls()
	case "SASL_PLAINTEXT":
	default:
		c.gap(protoKey, proto, "not a Kafka security protocol the relay knows: configure kafka.tls.* and kafka.sasl.*")
		return
	}
	if proto == "SASL_SSL" || proto == "SASL_PLAINTEXT" {
		c.sasl()
	}
}

func (c *converter) tls() {
	if key, v, ok := c.producerValue("ssl.truststore.location"); ok && v != "" {
		c.gap(key, v, "a Java trust store; the relay reads PEM: export the CA certificate (keytool -exportcert -rfc -keystore %s -alias <ca>) and set kafka.tls.ca_file", v)
	} else {
		c.note("ssl.truststore.location", "", "not set: Java trusted its default CAs; the relay trusts the system's roots unless kafka.tls.ca_file is set")
	}
	if key, v, ok := c.producerValue("ssl.keystore.location"); ok && v != "" {
		c.gap(key, v, "a Java key store with the client certificate; the relay reads PEM: export certificate and key (e.g. openssl pkcs12 -in store.p12 -nokeys / -nocerts -nodes) and set kafka.tls.cert_file and kafka.tls.key_file")
	}
	if key, v, ok := c.producerValue("ssl.endpoint.identification.algorithm"); ok && v == "" {
		c.gap(key, v, "Java skipped host name verification; the relay verifies the broker's name: set kafka.tls.server_name to the name in its certificate, or (insecure) kafka.tls.insecure_skip_verify")
	}
}

func (c *converter) sasl() {
	key, mech, ok := c.producerValue("sasl.mechanism")
	if !ok || mech == "" {
		key, mech = "sasl.mechanism", "GSSAPI" // Kafka's default
	}
	switch strings.ToUpper(mech) {
	case "PLAIN":
		c.set("kafka.sasl.mechanism", "plain", key)
	case "SCRAM-SHA-256":
		c.set("kafka.sasl.mechanism", "scram-sha-256", key)
	case "SCRAM-SHA-512":
		c.set("kafka.sasl.mechanism", "scram-sha-512", key)
	default:
		c.gap(key, mech, "the relay authenticates with SASL PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 only: give it such a user (kafka.sasl.*)")
		return
	}
	jaasKey, jaas, ok := c.producerValue("sasl.jaas.config")
	if !ok {
		c.gap("sasl.jaas.config", "", "not set: set kafka.sasl.username, and the password in RELAY_KAFKA_SASL_PASSWORD")
		return
	}
	if m := jaasUsername.FindStringSubmatch(jaas); m != nil && c.literal(jaasKey, m[1], "kafka.sasl.username") {
		c.set("kafka.sasl.username", m[1], jaasKey)
	} else if m == nil {
		c.gap(jaasKey, redacted, "no username=\"...\" in it: set kafka.sasl.username")
	}
	c.note(jaasKey, redacted, "passwords are never copied: set the password in the environment, RELAY_KAFKA_SASL_PASSWORD")
}
