package console

import "github.com/prometheus/client_golang/prometheus"

// metrics are the console's counters of refusals.
type metrics struct {
	proxyRefused  prometheus.Counter
	loginFailures *prometheus.CounterVec
	loginThrottle prometheus.Counter
	loginCompares prometheus.Counter
	// notify.go
	webhook         *prometheus.CounterVec
	webhookAttempts prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		proxyRefused: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "faultrouter", Subsystem: "console",
			Name: "proxy_header_refused_total",
			Help: "Requests carrying X-Forwarded-User or X-Forwarded-Email from a peer outside the trusted proxies; the header was stripped."}),
		loginFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "faultrouter", Subsystem: "console",
			Name: "login_failures_total",
			Help: "Failed sign-ins by reason: password (wrong name or password), csrf."}, []string{"reason"}),
		loginThrottle: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "faultrouter", Subsystem: "console",
			Name: "login_throttled_total",
			Help: "Sign-ins refused with 429 because the name or the address failed too often."}),
		loginCompares: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "faultrouter", Subsystem: "console",
			Name: "login_compares_total",
			Help: "Passwords compared with a bcrypt hash at sign-in (the attempts the limits let through)."}),
		webhook: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "faultrouter", Subsystem: "console",
			Name: "webhook_deliveries_total",
			Help: "Webhook notices by outcome: delivered, failed (after every attempt, or refused), deferred (the owner's queue was full; sent at a later scan)."}, []string{"result"}),
		webhookAttempts: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "faultrouter", Subsystem: "console",
			Name: "webhook_attempts_total", Help: "Webhook requests sent, first tries and retries."}),
	}
	if reg != nil {
		reg.MustRegister(m.proxyRefused, m.loginFailures, m.loginThrottle, m.loginCompares, m.webhook, m.webhookAttempts)
	}
	return m
}
