package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// producer are the Kafka producer's figures, per broker where they are the
// broker's. *Metrics is the sink's Observer (sink.Kafka.SetObserver).
type producer struct {
	latency    *prometheus.HistogramVec
	inFlight   *prometheus.GaugeVec
	unanswered *prometheus.CounterVec
	retries    prometheus.Counter
	resets     prometheus.Counter
}

// ProduceBuckets are the produce latency histogram's buckets, in seconds:
// 0.5 ms to 30 s.
var ProduceBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

func newProducer(reg *prometheus.Registry) *producer {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help})
	}
	p := &producer{
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: "kafka_produce_latency_seconds",
			Help: "Time from a produce request written to a broker to its answer (or to the connection failing under it), by broker (host:port).", Buckets: ProduceBuckets}, []string{"broker"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "kafka_requests_in_flight",
			Help: "Produce requests written to a broker and not yet answered, by broker (at most 5 each with the idempotent producer, 1 without)."}, []string{"broker"}),
		unanswered: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "kafka_produce_unanswered_total",
			Help: "Produce requests written to a broker that got no answer (connection lost or timed out): their outcome is unknown and the producer settles it, by broker."}, []string{"broker"}),
		retries: c("kafka_produce_retries_total", "Kafka writes retried after a broker-wide failure (the broker or the connection, not one event's)."),
		resets:  c("kafka_producer_resets_total", "New producer ids or epochs taken after the first: the broker lost track of the producer (its state expired, or a sequence gap)."),
	}
	reg.MustRegister(p.latency, p.inFlight, p.unanswered, p.retries, p.resets)
	return p
}

// ProduceAnswered records a produce request to broker answered, or failed
// (unanswered) once written, took after it was written.
func (m *Metrics) ProduceAnswered(broker string, took time.Duration, unanswered bool) {
	if m == nil {
		return
	}
	m.producer.latency.WithLabelValues(broker).Observe(took.Seconds())
	if unanswered {
		m.producer.unanswered.WithLabelValues(broker).Inc()
	}
}

// ProduceInFlight moves broker's count of produce requests in flight by
// delta.
func (m *Metrics) ProduceInFlight(broker string, delta int) {
	if m != nil {
		m.producer.inFlight.WithLabelValues(broker).Add(float64(delta))
	}
}

// ProduceRetried counts a Kafka write retried after a broker-wide failure.
func (m *Metrics) ProduceRetried() {
	if m != nil {
		m.producer.retries.Inc()
	}
}

// ProducerReset counts a new producer id taken after the first.
func (m *Metrics) ProducerReset() {
	if m != nil {
		m.producer.resets.Inc()
	}
}
