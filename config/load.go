// Load and Defaults: the settings read from the environment, and the defaults from the `default` tags.

package config

import (
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/kelseyhightower/envconfig"
)

// Load reads the settings from the environment and validates them. With
// BACKEND_TYPE unset and REDIS_URL or REDIS_SOCKET_TYPE set, BackendType is
// BackendRedis: a deployment of envoyproxy/ratelimit (whose default backend
// is Redis) keeps sharing its limits across replicas. With REDIS_SOCKET_TYPE
// unset and a REDIS_URL that is a path, the socket type is unix (upstream's
// default socket type).
func Load() (Settings, error) {
	var s Settings
	if err := envconfig.Process("", &s); err != nil {
		return Settings{}, fmt.Errorf("reading settings: %w", err)
	}
	if _, set := os.LookupEnv("REDIS_SOCKET_TYPE"); !set && strings.HasPrefix(s.Redis.URL, "/") {
		s.Redis.SocketType = SocketUnix // upstream's default, for its socket-path URLs
	}
	if _, set := os.LookupEnv("BACKEND_TYPE"); !set {
		for _, name := range redisHints {
			if _, ok := os.LookupEnv(name); ok {
				s.BackendType, s.backendInferred = BackendRedis, true
				break
			}
		}
	}
	if err := s.Validate(); err != nil {
		return Settings{}, err
	}
	return s, nil
}

// redisHints are the variables whose presence, with BACKEND_TYPE unset,
// selects the Redis backend.
var redisHints = []string{"REDIS_URL", "REDIS_SOCKET_TYPE"}

// BackendReason says why BackendType has its value, for the start-up log:
// "BACKEND_TYPE" when it was set or defaulted, or the sentence saying that
// the Redis settings chose it.
func (s Settings) BackendReason() string {
	if s.backendInferred {
		return "BACKEND_TYPE is unset and " + strings.Join(redisHints, " or ") + " is set: using Redis, as envoyproxy/ratelimit would; set BACKEND_TYPE=memory to keep limits in this process"
	}
	return "BACKEND_TYPE"
}

// Defaults returns the settings used when no environment variable is set
// (the `default` tags), whatever the environment holds. Tests start from it
// and override fields.
func Defaults() Settings {
	var s Settings
	if err := setDefaults(reflect.ValueOf(&s).Elem()); err != nil {
		panic(fmt.Sprintf("config: bad default tag: %v", err))
	}
	return s
}

// setDefaults sets every field of the struct v from its `default` tag.
func setDefaults(v reflect.Value) error {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f, fv := t.Field(i), v.Field(i)
		if !f.IsExported() {
			continue
		}
		if fv.Kind() == reflect.Struct {
			if err := setDefaults(fv); err != nil {
				return err
			}
			continue
		}
		def, ok := f.Tag.Lookup("default")
		if !ok {
			continue
		}
		if u, ok := fv.Addr().Interface().(interface{ UnmarshalText([]byte) error }); ok {
			if err := u.UnmarshalText([]byte(def)); err != nil {
				return fmt.Errorf("%s: %w", f.Name, err)
			}
			continue
		}
		var err error
		switch fv.Interface().(type) {
		case string:
			fv.SetString(def)
		case time.Duration:
			var d time.Duration
			d, err = time.ParseDuration(def)
			fv.SetInt(int64(d))
		case int:
			var n int64
			n, err = strconv.ParseInt(def, 10, 0)
			fv.SetInt(n)
		case bool:
			var b bool
			b, err = strconv.ParseBool(def)
			fv.SetBool(b)
		case float64:
			var x float64
			x, err = strconv.ParseFloat(def, 64)
			fv.SetFloat(x)
		default:
			err = fmt.Errorf("unsupported type %s", fv.Type())
		}
		if err != nil {
			return fmt.Errorf("%s: %w", f.Name, err)
		}
	}
	return nil
}
