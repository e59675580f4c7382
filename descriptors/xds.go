package descriptors

import (
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
)

// FromProto builds a Set from RateLimitConfig resources received over xDS
// (type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig), with
// the same validation as rule files. Errors name the resource as the file,
// "xds:<resource name>", with line 0. The proto carries only what
// envoyproxy/ratelimit's xDS API has: key, value, rate_limit (unit,
// requests_per_unit, unlimited, name, replaces), descriptors, shadow_mode and
// detailed_metric; the YAML extensions are not available over xDS.
func FromProto(cfgs []*rlsconfv3.RateLimitConfig, opts Options) (*Set, error) {
	b := newBuilder(opts)
	for _, cfg := range cfgs {
		if cfg == nil {
			continue
		}
		b.addFile(&rawFile{
			name:        "xds:" + cfg.GetName(),
			domain:      cfg.GetDomain(),
			descriptors: protoDescriptors(cfg.GetDescriptors()),
		})
	}
	return b.result()
}

func protoDescriptors(pbs []*rlsconfv3.RateLimitDescriptor) []*rawDescriptor {
	var out []*rawDescriptor
	for _, pb := range pbs {
		if pb == nil {
			continue
		}
		d := &rawDescriptor{
			key:            pb.GetKey(),
			value:          pb.GetValue(),
			shadowMode:     pb.GetShadowMode(),
			detailedMetric: pb.GetDetailedMetric(),
			children:       protoDescriptors(pb.GetDescriptors()),
		}
		if p := pb.GetRateLimit(); p != nil {
			l := &rawLimit{
				requestsPerUnit: p.GetRequestsPerUnit(),
				unlimited:       p.GetUnlimited(),
				name:            p.GetName(),
			}
			// UNKNOWN is the proto's "unset": fine for unlimited, reported
			// as an invalid unit otherwise, as envoyproxy/ratelimit does.
			if p.GetUnit() != rlsconfv3.RateLimitUnit_UNKNOWN || !p.GetUnlimited() {
				l.unit = p.GetUnit().String()
			}
			for _, r := range p.GetReplaces() {
				l.replaces = append(l.replaces, rawReplace{name: r.GetName()})
			}
			d.limits = []*rawLimit{l}
		}
		out = append(out, d)
	}
	return out
}
