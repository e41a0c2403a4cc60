"""An agents package of your own, as `turnlog serve|worker|demo|memory --agents
my_agents.agents:directory` loads it (README, "Deploy your agents"; docker-compose.yml mounts
this folder into every turnlog container). Nothing in turnlog imports it."""
