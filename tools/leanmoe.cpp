// placeholder: the CLI helper replaces this
int main() { return 0; }
