"""What every module that calls a Google Cloud API (gce_instance, gce_firewall, tpu_node, gce_iam_*...)
shares, documented once: the options of module_utils/gce_client.py's cloud_module, and check mode;
and the state option of those that keep one resource there or not."""

from __future__ import annotations


class ModuleDocFragment:
    """``extends_documentation_fragment: [google_cloud]`` (ansible.cfg: doc_fragment_plugins)."""

    DOCUMENTATION = r"""
options:
  project:
    description: Google Cloud project id.
    type: str
    required: true
  auth_kind:
    description:
      - V(application) uses Application Default Credentials (C(gcloud auth application-default login),
        C(GOOGLE_APPLICATION_CREDENTIALS), or the metadata server).
      - V(serviceaccount) reads O(service_account_file). V(anonymous) sends no credentials (only for a
        local fake API).
    type: str
    choices: [application, serviceaccount, anonymous]
    default: application
  service_account_file:
    description: Service-account JSON key file; required with O(auth_kind=serviceaccount).
    type: path
  api_endpoint:
    description:
      - The API's endpoint override (Compute Engine's, or Cloud TPU's for tpu_node), like
        C(endpoint_url) in amazon.aws modules. C(http://host:port) speaks plain HTTP (a local fake API).
    type: str
requirements:
  - google-auth
attributes:
  check_mode:
    description: Only reads are sent; the result says what a run would change.
    support: full
  diff_mode:
    description: Shows the compared fields before and after.
    support: full
"""

    # extends_documentation_fragment: [google_cloud, google_cloud.state] - gce_firewall and the
    # gce_iam_* modules; their argument_spec takes it from module_utils/gce_client.py PRESENT_OR_ABSENT.
    STATE = r"""
options:
  state:
    description: V(present) or V(absent).
    type: str
    choices: [present, absent]
    default: present
"""
